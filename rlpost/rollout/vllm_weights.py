"""How a Hugging Face checkpoint's tensors map onto the parameters of a vLLM engine: the manifest
of what the trainer sends (read from the config on the meta device), the part of a vLLM parameter
that holds one HF tensor (fused and sharded: `rlpost.rollout.vllm_shards`), the LoRA ranks vLLM
accepts, and where an adapter file is written."""

from __future__ import annotations

import os
import shutil

import torch

from rlpost.rollout.vllm_shards import Layer, fused_name, held_part, shard_slice, siblings
from rlpost.weightsync.manifest import Manifest, TensorSpec

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values


def expected_manifest(model_path: str, dtype: str, trust_remote_code: bool = False) -> Manifest:
    """Names and shapes of the HF checkpoint's parameters (what the trainer sends), from its
    config on the meta device: no weights are read or allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return [TensorSpec(n, tuple(p.shape), dtype) for n, p in model.named_parameters()]


def expected_adapter_manifest(model_path: str, lora, trust_remote_code: bool = False) -> Manifest:
    """Names and shapes of the adapter the trainer sends for `lora` (a LoraConfig), from the
    checkpoint's config wrapped by peft on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlpost.models.lora import ADAPTER_DTYPE, adapter_named_parameters, apply_lora

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = apply_lora(AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code), lora)
    dtype = str(ADAPTER_DTYPE).removeprefix("torch.")
    return [TensorSpec(n, tuple(p.shape), dtype) for n, p in adapter_named_parameters(model)]


def vllm_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds `rank`."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"model.lora.rank={rank}: vLLM serves adapters of rank <= {VLLM_LORA_RANKS[-1]}")
    return fits[0]


def shm_dir(nbytes: int) -> str | None:
    """Memory-backed /dev/shm for an adapter file of `nbytes` where it has room for two (the old
    one is deleted after the new one is written; containers often give /dev/shm only 64 MB),
    else None: the system's temporary folder."""
    shm = "/dev/shm"
    try:
        room = shutil.disk_usage(shm).free if os.access(shm, os.W_OK) else 0
    except OSError:
        room = 0
    return shm if room > 2 * nbytes + (16 << 20) else None


def vllm_module(hf_name: str) -> str:
    """The vLLM module that holds HF parameter `hf_name` (q/k/v and gate/up are fused)."""
    return fused_name(hf_name)[0].rpartition(".")[0]


def shard_view(held: dict[str, tuple[torch.Tensor, Layer]], manifest: dict[str, TensorSpec], name: str):
    """(the part of a vLLM parameter that holds HF tensor `name`, which slice of `name` it is), or
    None where vLLM keeps it in a layout that cannot be sliced back (repacked kernels). `held`:
    vLLM's parameters by name, each with its layer (`rlpost.rollout.vllm_shards.layer_of`)."""
    spec = manifest[name]
    target, piece = fused_name(name)
    entry = held.get(target)
    if entry is None:  # with enable_lora vLLM keeps adaptable layers' weights under base_layer
        module, _, leaf = target.rpartition(".")
        entry = held.get(f"{module}.base_layer.{leaf}")
    if entry is None:
        return None
    tensor, layer = entry
    pieces = None if piece is None else [manifest[n].shape[0] for n in siblings(name)]
    s = shard_slice(layer, spec.shape, pieces, piece or 0)
    view = None if s is None else held_part(tensor, s, spec.shape)
    return None if view is None else (view, s)  # vocab rows past the checkpoint's are vLLM padding
