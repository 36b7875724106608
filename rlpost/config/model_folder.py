"""The model folders a config names (`model.path`, `critic.model_path`, `reward.model.path`),
checked before anything loads them: a local path that is not there, a file where its folder is
wanted, a folder without config.json or with one that is not JSON, no weights, a `model_type`
transformers does not know. Each returns what is wrong, naming the key and what to do, or None
(a hub id, the tiny model: checked where they load). The rules that call them: `rules.py`."""

from __future__ import annotations

import json
from pathlib import Path

WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.bin.index.json", "*.pt")
MODEL_FOLDER = (
    "a model folder holds config.json, the weights (model.safetensors or pytorch_model.bin) and the tokenizer "
    "files (tokenizer.json, tokenizer_config.json), as save_pretrained writes them"
)


def looks_local(path: str) -> bool:
    """A path, not a hub id (`org/name`): absolute, home- or dot-relative, or of 3+ parts."""
    return path.startswith(("/", "~", "./", "../")) or path.count("/") >= 2


def missing_folder(key: str, path: str) -> str | None:
    """What keeps the local model `path` from loading, or None: no such path, a file that is not a
    `.gguf`, a folder without config.json (an rlpost run, an adapter, an empty folder), or a
    config.json that is not a JSON object."""
    if not path or path == "tiny":
        return None
    local = Path(path).expanduser()
    if looks_local(path) and not local.exists():
        return f"{key}={path!r}: no such file or folder (a hub id looks like `org/name`)"
    if local.is_file() and not path.lower().endswith(".gguf"):
        return f"{key}={path!r} is a file: give the folder that holds it ({local.parent}); {MODEL_FOLDER}"
    if not local.is_dir():
        return None  # a hub id, a packaged GGUF model's name
    if not (local / "config.json").exists():
        return no_config(key, path, local)
    return config_json_problem(key, path, local / "config.json")


def no_config(key: str, path: str, folder: Path) -> str:
    """What a folder without config.json is, and what to give instead."""
    if (folder / "config.yaml").exists():
        return (
            f"{key}={path!r} is an rlpost run folder, not a model: export its model first "
            f"(rlpost export {path} --out DIR) and set {key}=DIR"
        )
    if (folder / "adapter_config.json").exists():
        return f"{key}={path!r} holds a LoRA adapter (adapter_config.json), not a model: give its base model's folder"
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if ggufs:
        return f"{key}={path!r}: no config.json in it, but a GGUF file: give the file itself ({folder / ggufs[0]})"
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError as e:
        return f"{key}={path!r}: cannot read the folder ({e.strerror}): make it readable, or give another"
    held = f"it holds {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}" if names else "it is empty"
    return f"{key}={path!r}: no config.json in this folder ({held}), not a Hugging Face model: {MODEL_FOLDER}"


def config_json_problem(key: str, path: str, file: Path) -> str | None:
    """config.json must be a JSON object (transformers reads the model's settings from it)."""
    try:
        config = json.loads(file.read_text())
    except ValueError as e:  # not JSON, not UTF-8
        return f"{key}={path!r}: {file} is not valid JSON ({e}): repair it, or copy the model's config.json again"
    except OSError as e:
        return f"{key}={path!r}: cannot read {file} ({e.strerror}): make it readable"
    if not isinstance(config, dict):
        return f"{key}={path!r}: {file} holds a JSON {type(config).__name__}, not the model's settings (an object)"
    return None


def folder_without_weights(key: str, path: str) -> str | None:
    """A local model folder (config.json in it) must hold weights."""
    folder = Path(path).expanduser() if path not in ("", "tiny") else None
    if folder and folder.is_dir() and (folder / "config.json").is_file():
        if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
            return (
                f"{key}={path!r} holds config.json but no weights (model.safetensors, "
                "pytorch_model.bin or a sharded index): copy them in, or point at the folder that has them"
            )
    return None


def unknown_model_type(key: str, path: str, trust_remote_code: bool) -> str | None:
    """config.json's `model_type` must be one transformers knows (AutoConfig's table), unless the
    model brings its own code (`auto_map`) and `model.trust_remote_code` runs it."""
    file = Path(path).expanduser() / "config.json" if path not in ("", "tiny") else None
    if file is None or not file.is_file():
        return None
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return None  # said by missing_folder
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or ("auto_map" in config and trust_remote_code):
        return None
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type in CONFIG_MAPPING:
        return None
    own_code = ", or set model.trust_remote_code=true to run the model's own code (auto_map)"
    own_code = own_code if "auto_map" in config else ""
    return (
        f"{key}={path!r}: {file} has model_type={model_type!r}, which transformers {transformers.__version__} does "
        f"not know: correct model_type (the model's family, e.g. qwen2 or llama), or upgrade transformers{own_code}"
    )
