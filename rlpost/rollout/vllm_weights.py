"""How a Hugging Face checkpoint's tensors map onto the parameters of a vLLM engine: the manifest
of what the trainer sends (read from the config on the meta device), vLLM's fused projections
(q/k/v into `qkv_proj`, gate/up into `gate_up_proj`) and the slice of a fused parameter that holds
one HF tensor, the LoRA ranks vLLM accepts, and where an adapter file is written."""

from __future__ import annotations

import os
import shutil

import torch

from rlpost.weightsync.manifest import Manifest, TensorSpec

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values

# HF projections that vLLM fuses into one parameter, and their order inside it
FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


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
    parts = hf_name.split(".")
    if len(parts) >= 2 and parts[-2] in FUSED:
        parts[-2] = FUSED[parts[-2]][0]
    return ".".join(parts[:-1])


def fused_view(params: dict[str, torch.Tensor], manifest: dict[str, TensorSpec], name: str):
    """The part of a vLLM parameter that holds HF tensor `name`, or None if vLLM keeps it in a
    layout that cannot be sliced back (repacked kernels, tensor parallel shards)."""
    spec = manifest[name]
    parts = name.split(".")
    target, piece = name, None
    if len(parts) >= 2 and parts[-2] in FUSED:
        fused, piece = FUSED[parts[-2]]
        target = ".".join(parts[:-2] + [fused, parts[-1]])
    held = params.get(target)
    if held is None:  # with enable_lora vLLM keeps adaptable layers' weights under base_layer
        module, _, leaf = target.rpartition(".")
        held = params.get(f"{module}.base_layer.{leaf}")
    if held is None or held.dim() != len(spec.shape) or tuple(held.shape[1:]) != spec.shape[1:]:
        return None
    start = 0
    if piece is not None:
        siblings = [k for k, (f, _) in FUSED.items() if f == FUSED[parts[-2]][0]]
        for k in siblings[:piece]:
            start += manifest[".".join(parts[:-2] + [k, parts[-1]])].shape[0]
    if start + spec.shape[0] > held.shape[0]:
        return None
    return held[start : start + spec.shape[0]]  # vocab rows past the checkpoint's are vLLM padding
