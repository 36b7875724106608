"""A local model folder's parts checked against each other before any actor starts (the
controller's `load_data` calls them): the weights' shapes against its config.json (the safetensors
headers against a model built on the meta device: no weights are read), and a tokenizer that can
end a response (an eos token). Each returns what is wrong, or None."""

from __future__ import annotations

import json
from pathlib import Path


def meta_model(path: str, trust_remote_code: bool = False):
    """The causal LM of `path`'s config.json, built on the meta device (shapes only, no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def header_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a safetensors file, from its header (8 bytes of length, then JSON)."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 1 << 30:
            return {}
        header = json.loads(f.read(size))
    return {name: tuple(t["shape"]) for name, t in header.items() if name != "__metadata__"}


def safetensors_files(folder: Path) -> list[str]:
    """The folder's safetensors files: those of its index when sharded, else every one."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
    return sorted(p.name for p in folder.glob("*.safetensors"))


def cut_short(path: str) -> str | None:
    """The first safetensors file of the folder `path` that is shorter than its header says (a
    copy or download that did not finish), or None."""
    folder = Path(path).expanduser()
    for name in safetensors_files(folder) if folder.is_dir() else []:
        file = folder / name
        have = file.stat().st_size if file.is_file() else 0
        try:
            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size)) if 0 < size < 1 << 30 else None
            ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
            need = 8 + size + max(ends, default=0)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return f"{file} has no readable safetensors header ({have} bytes): the file is damaged or cut short"
        if have < need:
            return f"{file} is cut short: {have} bytes, its header needs {need}"
    return None


def file_shapes(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, the file that holds it), over the folder's safetensors files (those of its
    index when sharded); {} where there are none (`.bin` weights: not read here)."""
    found = {}
    for name in safetensors_files(folder):
        found.update({k: (shape, name) for k, shape in header_shapes(folder / name).items()})
    return found


def weight_mismatch(path: str, trust_remote_code: bool = False) -> str | None:
    """The first weight (in the model's order) whose shape in the folder's safetensors files is
    not the one its config.json asks for, said with both shapes; None when they fit, or where this
    cannot tell (a hub id, quantized or `.bin` weights, a config the meta model cannot be built from:
    the loader says it then)."""
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        return None
    try:
        if "quantization_config" in json.loads((folder / "config.json").read_text()):
            return None  # packed weights: their stored shapes are not the config's
        stored = file_shapes(folder)
        wanted = meta_model(path, trust_remote_code).state_dict() if stored else {}
    except Exception:  # noqa: BLE001  (a check before the loader: what it cannot read, the loader says)
        return None
    for name, tensor in wanted.items():
        shape, file = stored.get(name, (tuple(tensor.shape), ""))
        if shape != tuple(tensor.shape):
            return (
                f"{name} is {list(shape)} in {file}, but config.json makes it {list(tensor.shape)}: give the "
                "config.json these weights were saved with (or the weights of this config)"
            )
    return None


def architecture_problem(path: str, trust_remote_code: bool = False) -> str | None:
    """Why rlpost cannot train the model of `path`'s config.json (no decoder layers where it shards them:
    an encoder such as BERT, the seventeenth catalogue's t79, died in the actors after Ray started), or
    None; also None where the meta model cannot be built (the loader says why then)."""
    if not (Path(path).expanduser() / "config.json").is_file():
        return None
    try:
        model = meta_model(path, trust_remote_code)
    except Exception:  # noqa: BLE001  (a check before the loader: what it cannot read, the loader says)
        return None
    try:
        decoder_layers(model)
    except ValueError:
        kind = getattr(model.config, "model_type", "?")
        return (
            f"its config.json makes a {type(model).__name__} (model_type {kind}), whose decoder layers rlpost does "
            "not find (model.layers, transformer.h or model.decoder.layers): rlpost trains decoder-only causal LMs "
            "such as Qwen2 and Llama"
        )
    return None


def decoder_layers(model) -> list:
    """The repeated transformer blocks of a Hugging Face causal LM (inside a peft wrapper too)."""
    if hasattr(model, "get_base_model"):  # peft.PeftModel: the transformers model it wraps
        model = model.get_base_model()
    for path in ("model.layers", "transformer.h", "model.decoder.layers"):
        module = model
        try:
            for part in path.split("."):
                module = getattr(module, part)
        except AttributeError:
            continue
        return list(module)
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")
