"""LoRA with peft under FSDP2: wrap the policy, sync it as merged weights or as an adapter, export.

`apply_lora` wraps a transformers causal LM with peft before FSDP2 shards it; only the adapter
(lora_A/lora_B) then requires grad. Rollouts see the adapter in one of two ways (`model.lora.mode`):

- merge: `merged_weights` yields W + (alpha/r) B A for every parameter of the *base* model, under
  the base model's names and in its `named_parameters` order, one parameter at a time. It gathers
  each sharded parameter (a collective), merges out of place and yields a tensor of its own, so the
  sharded weights stay bitwise unchanged and nothing yielded aliases FSDP's storage (verl #7014).
- adapter: `base_weights` (the first sync of a run) yields the base parameters without the
  adapter; then `adapter_weights` yields the full lora_A/lora_B tensors under the names peft's
  `get_peft_model_state_dict` gives them; `save_adapter` writes them as a peft adapter folder
  (adapter_model.safetensors + adapter_config.json) that peft and vLLM's LoRA loader read.

`sync_kinds` says which of these one sync carries (`SYNC_KINDS`); trainer and rollouts build
their manifests for it independently, so a mismatch is refused before any tensor moves.

`export_merged` turns a base model and a saved adapter into a plain transformers model folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch.distributed.fsdp import FSDPModule

from rlpost.models.loading import DTYPES, load_causal_lm, load_tokenizer
from rlpost.trainer.fsdp import full_tensor

# What one weight sync carries (the controller picks it; trainer and rollouts agree on the manifest):
#   full     the plain parameters (no LoRA)
#   merged   W + (alpha/r) B A under the base model's names (model.lora.mode=merge)
#   base     the frozen base weights without the adapter (model.lora.mode=adapter, first sync)
#   adapter  lora_A/lora_B only (model.lora.mode=adapter), as float32 masters (small; engines cast)
SYNC_KINDS = ("full", "merged", "base", "adapter")
ADAPTER_DTYPE = torch.float32

PEFT_PREFIX = "base_model.model."  # peft's wrapper prefix before the base model's own names
_ADAPTER_KEY = re.compile(r"^base_model\.model\..+\.lora_[AB]\.weight$")


def apply_lora(model, lora_cfg):
    """Wrap `model` (a transformers causal LM, not yet sharded) with peft LoRA adapters; the base
    weights are frozen. `target_modules: [all-linear]` is every linear layer but the output head."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    if lora_cfg.rank <= 0:
        raise ValueError(f"model.lora.rank must be > 0 to apply LoRA, got {lora_cfg.rank}")
    targets = list(lora_cfg.target_modules)
    if "all-linear" in targets and len(targets) > 1:
        raise ValueError(f"model.lora.target_modules: `all-linear` stands alone, got {targets}")
    config = LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha,
                        target_modules="all-linear" if targets == ["all-linear"] else targets,
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    # An adapter on a head tied to the embeddings would merge into both; the base model names the
    # shared weight once (as the embedding), so merged_weights could not express it.
    embedding = peft_model.get_input_embeddings().weight
    for name, module in peft_model.named_modules():
        if isinstance(module, BaseTunerLayer) and module.get_base_layer().weight is embedding:
            raise ValueError(f"LoRA on {base_name(name)!r}, whose weight is tied to the input "
                             "embeddings, is not supported; leave it out of model.lora.target_modules")
    return peft_model


def sync_kinds(cfg, first: bool) -> list[str]:
    """The syncs, in order, that bring the rollouts to the trainer's policy (`cfg`: a
    TrainConfig). `first`: the first sync of a run or after a resume, when the rollouts hold only
    what they loaded from `model.path`; in adapter mode it sends the base, then the adapter (after
    a resume the adapter is not zero), and every later sync the adapter only."""
    lora = cfg.model.lora
    if lora.rank <= 0:
        return ["full"]
    if lora.mode == "merge":
        return ["merged"]
    return ["base", "adapter"] if first else ["adapter"]


# ------------------------------------------------------------------------------------------ names
def is_lora_name(name: str) -> bool:
    """Whether a peft parameter name belongs to an adapter (lora_A, lora_B, ...), not the base."""
    return any(part.startswith("lora_") for part in name.split("."))


def base_name(peft_name: str) -> str:
    """The base model's name of a peft parameter name:
    `base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`
    -> `model.layers.0.self_attn.q_proj.weight`."""
    return peft_name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def base_named_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    """(base model name, parameter) of every base parameter of a peft model, in the base model's
    `named_parameters` order (the order `merged_weights` yields; no lora_* entries). Parameters may
    be sharded: `p.shape` is still the full shape, as a sync manifest needs."""
    return [(base_name(n), p) for n, p in model.named_parameters() if not is_lora_name(n)]


def adapter_named_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    """(peft state-dict key, parameter) of the active adapter's lora_A/lora_B weights, in
    `named_parameters` order (the order `adapter_weights` yields). Parameters may be sharded:
    `p.shape` is the full shape."""
    adapter = model.active_adapter
    return [(adapter_key(n, adapter), p) for n, p in model.named_parameters()
            if f".lora_A.{adapter}." in n or f".lora_B.{adapter}." in n]


def adapter_key(peft_name: str, adapter: str = "default") -> str:
    """The `get_peft_model_state_dict` key of an adapter parameter (no adapter-name infix):
    `...q_proj.lora_A.default.weight` -> `...q_proj.lora_A.weight`."""
    parts = peft_name.split(".")
    return ".".join(p for i, p in enumerate(parts)
                    if not (i > 0 and parts[i - 1] in ("lora_A", "lora_B") and p == adapter))


# ------------------------------------------------------------------------------ gathering values
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


def _merged(layer, weight: torch.Tensor) -> torch.Tensor:
    """W + scaling * B @ A of a peft LoRA Linear for each active adapter, in float32, out of place
    (`weight` is the full base weight; A and B are gathered here)."""
    from peft.tuners.lora import Linear

    if not isinstance(layer, Linear) or any(layer.use_dora.values()):
        raise NotImplementedError(f"merging {type(layer).__name__} (only plain LoRA on Linear layers)")
    if layer.merged:
        raise RuntimeError("the adapter is merged into the base weights already (layer.merge())")
    merged = weight.float()
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        a = _gather(layer.lora_A[adapter].weight).float()
        b = _gather(layer.lora_B[adapter].weight).float()
        if layer.fan_in_fan_out:  # weight stored as [in, out] (GPT-2 Conv1D)
            a, b = b.T, a.T
        merged = torch.addmm(merged, b, a, alpha=layer.scaling[adapter])  # a new tensor
    return merged


@torch.no_grad()
def merged_weights(model, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(base name, merged full tensor in `dtype`) for every base parameter of the (FSDP2-sharded or
    plain) peft `model`, in the base model's `named_parameters` order. LoRA layers give
    W + (alpha/r) B @ A, computed in float32 from the float32 master weights; other parameters
    (embeddings, norms, biases) their full values.

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
            value = _merged(model.get_submodule(owner.removesuffix(".base_layer")), value)
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


# ------------------------------------------------------------------------------- files on disk
def save_adapter(named_tensors: Iterable[tuple[str, torch.Tensor]], lora_cfg, folder,
                 base_model_name_or_path: str | None = None) -> Path:
    """Write a peft adapter folder: adapter_model.safetensors (the `adapter_weights` names) and
    adapter_config.json (r, lora_alpha, explicit target module names, CAUSAL_LM), readable by
    `peft.PeftModel.from_pretrained(base, folder)` and vLLM's LoRA loader. Rank 0 only."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    tensors = {name: t.detach().cpu().contiguous() for name, t in named_tensors}
    bad = [name for name in tensors if not _ADAPTER_KEY.match(name)]
    if bad or not tensors:
        raise ValueError(f"not peft adapter keys (`base_model.model.<module>.lora_A.weight`): "
                         f"{bad[:3] or 'no tensors'}")
    modules = sorted({name.split(".")[-3] for name in tensors})  # ...q_proj.lora_A.weight -> q_proj
    config = LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, target_modules=modules,
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                        base_model_name_or_path=base_model_name_or_path)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(folder))
    return folder


def export_merged(base_model_path: str, adapter_folder, out_dir, dtype: str = "float32",
                  trust_remote_code: bool = False) -> Path:
    """Base model + adapter folder -> a plain transformers model folder (weights merged in float32,
    saved in `dtype`) with the base model's tokenizer."""
    from peft import PeftModel

    base = load_causal_lm(base_model_path, "float32", trust_remote_code=trust_remote_code)
    model = PeftModel.from_pretrained(base, str(adapter_folder)).merge_and_unload()
    out_dir = Path(out_dir)
    model.to(DTYPES[dtype]).save_pretrained(out_dir)
    load_tokenizer(base_model_path, trust_remote_code).save_pretrained(out_dir)
    return out_dir
