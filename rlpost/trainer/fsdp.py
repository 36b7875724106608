"""FSDP2 wrapping: each decoder layer is one FSDP unit, the root holds embeddings and head."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlpost.models.checks import decoder_layers


def shard_model(model: torch.nn.Module, device: torch.device, compute_dtype: torch.dtype, cpu_offload: bool = False):
    """Move to `device` and shard with FSDP2 over the default process group (parameters and
    gradients kept on the CPU between uses with `cpu_offload`).

    On one rank with float32 compute and no offload there is nothing to shard, gather, cast or
    offload: the model stays a plain module. FSDP2's hooks and copies would cost a tenth of the
    quickstart's update step (benchmarks/bench_overhead.py); everything downstream (exports,
    checkpoints, the layerwise optimizer, LoRA merges) takes plain and sharded parameters alike."""
    model = model.to(device)
    if dist.get_world_size() == 1 and compute_dtype == torch.float32 and not cpu_offload:
        return model
    kwargs = {}
    if compute_dtype != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    if cpu_offload and device.type == "cuda":
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The unsharded value of a (possibly) sharded tensor; a collective for DTensors over several
    ranks. On one rank the local tensor is the whole one (both alias the parameter's storage);
    `to_local` skips the redistribution machinery (the quickstart model's export: 3.5 -> 1.0 ms)."""
    if not isinstance(t, DTensor):
        return t
    return t.to_local() if t.device_mesh.size() == 1 else t.full_tensor()


def fsdp_units(model: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    """Parameters grouped by FSDP unit: one group per decoder layer, then the root's own."""
    units = [list(layer.parameters()) for layer in decoder_layers(model)]
    in_layers = {id(p) for unit in units for p in unit}
    return units + [[p for p in model.parameters() if id(p) not in in_layers]]


@contextmanager
def params_on(model: torch.nn.Module, device: torch.device, keep: bool = False):
    """Inside the block every parameter (shard) of `model` is on `device`; afterwards they go
    back to the device they were on, unless `keep`. FSDP2 moves sharded modules with
    `module.to`, which swaps the tensors in place: optimizers keep their references."""
    homes = {p.device for p in model.parameters()}
    if len(homes) > 1:
        raise ValueError(f"parameters on several devices {sorted(map(str, homes))}; cannot move them as one")
    home = homes.pop() if homes else torch.device(device)
    moved = home != torch.device(device)
    if moved:
        model.to(device)
    try:
        yield model
    finally:
        if moved and not keep:
            model.to(home)
