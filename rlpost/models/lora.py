"""LoRA as both sides of a weight sync see it: peft wrapping, parameter names, adapter files.

`apply_lora` wraps a transformers causal LM with peft (the trainer does it before FSDP2 shards the
model; an `hf` rollout in adapter mode does it too); only the adapter (lora_A/lora_B) then requires
grad. The base model's names of a peft model's parameters (`base_named_parameters`) and the
adapter's peft state-dict keys (`adapter_named_parameters`) are what weight-sync manifests list.
`save_adapter` writes a peft adapter folder (adapter_model.safetensors + adapter_config.json) that
peft and vLLM's LoRA loader read; `export_merged` turns a base model and such a folder into a
plain transformers model folder. The FSDP2-aware exports (merged weights, gathered adapters) are
the trainer's: `rlpost.trainer.lora`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import torch

from rlpost.models.loading import DTYPES, load_causal_lm, load_tokenizer

ADAPTER_DTYPE = torch.float32  # adapters travel and are held as float32 masters (small; engines cast)
PEFT_PREFIX = "base_model.model."  # peft's wrapper prefix before the base model's own names
_ADAPTER_KEY = re.compile(r"^base_model\.model\..+\.lora_[AB]\.weight$")


def apply_lora(model, lora_cfg):
    """Wrap `model` (a transformers causal LM, not yet sharded) with peft LoRA adapters; the base
    weights are frozen. `target_modules: [all-linear]` is every linear layer but the output head."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    if lora_cfg.rank <= 0:
        raise ValueError(f"model.lora.rank must be > 0 to apply LoRA, got {lora_cfg.rank}")
    targets = list(lora_cfg.target_modules)  # checked by the config (model.lora.target_modules)
    config = LoraConfig(
        r=lora_cfg.rank,
        lora_alpha=lora_cfg.alpha,
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    # An adapter on a head tied to the embeddings would merge into both; the base model names the
    # shared weight once (as the embedding), so merged_weights could not express it.
    embedding = peft_model.get_input_embeddings().weight
    for name, module in peft_model.named_modules():
        if isinstance(module, BaseTunerLayer) and module.get_base_layer().weight is embedding:
            raise ValueError(
                f"LoRA on {base_name(name)!r}, whose weight is tied to the input "
                "embeddings, is not supported; leave it out of model.lora.target_modules"
            )
    return peft_model


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
    return [
        (adapter_key(n, adapter), p)
        for n, p in model.named_parameters()
        if f".lora_A.{adapter}." in n or f".lora_B.{adapter}." in n
    ]


def adapter_key(peft_name: str, adapter: str = "default") -> str:
    """The `get_peft_model_state_dict` key of an adapter parameter (no adapter-name infix):
    `...q_proj.lora_A.default.weight` -> `...q_proj.lora_A.weight`."""
    parts = peft_name.split(".")
    return ".".join(
        p for i, p in enumerate(parts) if not (i > 0 and parts[i - 1] in ("lora_A", "lora_B") and p == adapter)
    )


# ------------------------------------------------------------------------------- files on disk
def save_adapter(
    named_tensors: Iterable[tuple[str, torch.Tensor]], lora_cfg, folder, base_model_name_or_path: str | None = None
) -> Path:
    """Write a peft adapter folder: adapter_model.safetensors (the `adapter_weights` names) and
    adapter_config.json (r, lora_alpha, explicit target module names, CAUSAL_LM), readable by
    `peft.PeftModel.from_pretrained(base, folder)` and vLLM's LoRA loader. Rank 0 only."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    tensors = {name: t.detach().cpu().contiguous() for name, t in named_tensors}
    bad = [name for name in tensors if not _ADAPTER_KEY.match(name)]
    if bad or not tensors:
        raise ValueError(
            f"not peft adapter keys (`base_model.model.<module>.lora_A.weight`): {bad[:3] or 'no tensors'}"
        )
    modules = sorted({name.split(".")[-3] for name in tensors})  # ...q_proj.lora_A.weight -> q_proj
    config = LoraConfig(
        r=lora_cfg.rank,
        lora_alpha=lora_cfg.alpha,
        target_modules=modules,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model_name_or_path,
    )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(folder))
    return folder


def export_merged(
    base_model_path: str, adapter_folder, out_dir, dtype: str = "float32", trust_remote_code: bool = False
) -> Path:
    """Base model + adapter folder -> a plain transformers model folder (weights merged in float32,
    saved in `dtype`) with the base model's tokenizer."""
    from peft import PeftModel

    base = load_causal_lm(base_model_path, "float32", trust_remote_code=trust_remote_code)
    model = PeftModel.from_pretrained(base, str(adapter_folder)).merge_and_unload()
    out_dir = Path(out_dir)
    model.to(DTYPES[dtype]).save_pretrained(out_dir)
    load_tokenizer(base_model_path, trust_remote_code).save_pretrained(out_dir)
    return out_dir
