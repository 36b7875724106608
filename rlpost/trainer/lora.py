"""LoRA under FSDP2: the trainer's exports of a sharded peft model, one parameter at a time.

Rollouts see the adapter in one of two ways (`model.lora.mode`, sync kinds in
`rlpost.weightsync.kinds`):

- merge: `merged_weights` yields W + (alpha/r) B A for every parameter of the *base* model, under
  the base model's names and in its `named_parameters` order, one parameter at a time. It gathers
  each sharded parameter (a collective), merges out of place and yields a tensor of its own, so the
  sharded weights stay bitwise unchanged and nothing yielded aliases FSDP's storage (verl #7014).
- adapter: `base_weights` (the first sync of a run) yields the base parameters without the
  adapter; then `adapter_weights` yields the full lora_A/lora_B tensors under the names peft's
  `get_peft_model_state_dict` gives them (`rlpost.models.lora.save_adapter` writes them as a peft
  adapter folder).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.fsdp import FSDPModule

from rlpost.models.lora import adapter_named_parameters, base_name, base_named_parameters, is_lora_name
from rlpost.trainer.fsdp import full_tensor


def _reshard_all(model) -> None:
    """Put every FSDP unit in its sharded state. After a forward without backward FSDP2 leaves
    the root unit unsharded, its parameters plain tensors in the compute dtype; sharded, they are
    DTensors holding the float32 master values we merge."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _gather(param: torch.Tensor) -> torch.Tensor:
    """The full value of a parameter: an all-gather (a collective) for a sharded one, gathered on
    the mesh's device where FSDP keeps the shards on the host. May alias the parameter."""
    param = param.detach()
    if hasattr(param, "device_mesh"):  # DTensor
        param = param.to(param.device_mesh.device_type)
    return full_tensor(param)


def _own(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`value`, copied if it still shares storage with `param` (an unsharded parameter, or a
    one-rank all-gather, returns the parameter's own storage, which later steps overwrite)."""
    local = param.to_local() if hasattr(param, "to_local") else param
    if value.untyped_storage().data_ptr() == local.untyped_storage().data_ptr():
        return value.clone()
    return value


def merge_weight(weight: torch.Tensor, adapters: list, dtype: torch.dtype) -> torch.Tensor:
    """W + sum of scaling * B @ A over `adapters` ([(A, B, scaling)]), out of place, rounded to
    `dtype`: W, A and B are first rounded to `dtype` (as FSDP's mixed precision hands them to a
    forward), the sum is taken in float32, then rounded once. The sync (`merged_weights`) and the
    trainer's merged forward (`MergedLoraLinear`) both compute it here, so the rollout holds bit
    for bit the weight the trainer computes with."""
    merged = weight.to(dtype).float()
    for a, b, scaling in adapters:
        merged = torch.addmm(merged, b.to(dtype).float(), a.to(dtype).float(), alpha=scaling)  # a new tensor
    return merged.to(dtype)


def _merged(layer, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`merge_weight` of a peft LoRA Linear for each active adapter (`weight` is the full base
    weight; A and B are gathered here)."""
    from peft.tuners.lora import Linear as PeftLoraLinear  # (imported where LoRA is used: seconds)

    if not isinstance(layer, PeftLoraLinear) or any(layer.use_dora.values()):
        raise NotImplementedError(f"merging {type(layer).__name__} (only plain LoRA on Linear layers)")
    if layer.merged:
        raise RuntimeError("the adapter is merged into the base weights already (layer.merge())")
    adapters = []
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        a, b = _gather(layer.lora_A[adapter].weight), _gather(layer.lora_B[adapter].weight)
        if layer.fan_in_fan_out:  # weight stored as [in, out] (GPT-2 Conv1D)
            a, b = b.T, a.T
        adapters.append((a, b, layer.scaling[adapter]))
    return merge_weight(weight, adapters, dtype)


@torch.no_grad()
def merged_weights(model, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(base name, merged full tensor in `dtype`) for every base parameter of the (FSDP2-sharded or
    plain) peft `model`, in the base model's `named_parameters` order. LoRA layers give
    W + (alpha/r) B @ A as `_merged` rounds it (the weight the merged forward computes with);
    other parameters (embeddings, norms, biases) their full values.

    A generator, consumed one bucket at a time: it gathers one parameter at a time (an adapted
    weight with its A and B), so its extra memory is a few copies of the largest parameter, less
    than one FSDP unit. Every tensor yielded is its own storage: keeping them all, then stepping
    the optimizer or running forward passes, leaves them unchanged. The model's weights are never
    written (sharded values stay bitwise equal).

    Gathering is a collective: every rank must run the generator to the end, in step; only rank 0
    (the one that sends to the rollouts) needs the values, the others drop them."""
    _reshard_all(model)
    for name, param in model.named_parameters():
        if is_lora_name(name):
            continue  # merged into its base layer's weight
        value = _gather(param)
        owner, _, leaf = name.rpartition(".")
        if owner.endswith(".base_layer") and leaf == "weight":
            value = _merged(model.get_submodule(owner.removesuffix(".base_layer")), value, dtype)
        yield base_name(name), _own(value.to(dtype), param)


@torch.no_grad()
def base_weights(model, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(base name, full tensor in `dtype`) of every base parameter of the (FSDP2-sharded or plain)
    peft `model`, without the adapter (what `merged_weights` yields with B = 0), in the base
    model's `named_parameters` order. A collective, like `merged_weights`."""
    _reshard_all(model)
    for name, param in base_named_parameters(model):
        yield name, _own(_gather(param).to(dtype), param)


@torch.no_grad()
def adapter_weights(model, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(peft state-dict key, full tensor) of the active adapter's lora_A/lora_B weights of the
    (FSDP2-sharded or plain) peft `model`, in `named_parameters` order, e.g.
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` (peft, vLLM and
    `save_adapter` read these names). Float32 masters unless `dtype`. A collective, like
    `merged_weights`: every rank runs it to the end; rank 0 uses the values."""
    _reshard_all(model)
    for key, param in adapter_named_parameters(model):
        value = _gather(param)
        yield key, _own(value.to(dtype or value.dtype), param)


@contextmanager
def adapters_off(model):
    """Forwards of the base model (the LoRA KL reference): every LoRA layer skips its adapters.
    Unlike peft's `disable_adapter`, which sets `requires_grad=False` on the adapters until it
    exits, the adapters stay trainable: FSDP2 fixes a unit's gradient dtypes at its first forward
    from the parameters that require grad then, so a first forward with none (the reference at
    the first step of a resumed run) left the adapters' gradients in bfloat16 against float32
    masters, and the backward failed."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [m._disable_adapters for m in layers]
    for m in layers:
        m._disable_adapters = True
    try:
        yield
    finally:
        for m, off in zip(layers, before):
            m._disable_adapters = off
