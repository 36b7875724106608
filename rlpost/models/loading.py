"""Load a causal LM (or a value model) and its tokenizer from a hub id or a local folder; a
packaged GGUF model's name or a `.gguf` file resolves to the Hugging Face folder it converts into
(`rlpost.models.gguf`). The tiny model (`model.path=tiny`) is built by `rlpost.tiny`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_causal_lm(path: str, dtype: str, attn_implementation: str = "sdpa", trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    if attn_implementation == "rlpost_varlen":
        from rlpost.models import varlen

        varlen.register()
    return AutoModelForCausalLM.from_pretrained(
        path,
        dtype=DTYPES[dtype],
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )


def load_value_model(path: str, dtype: str, attn_implementation: str = "sdpa", trust_remote_code: bool = False):
    """A value model: the body of the causal LM at `path` with a scalar head per token (a new
    `score` layer unless `path` holds one), no dropout before it."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    if attn_implementation == "rlpost_varlen":
        from rlpost.models import varlen

        varlen.register()
    config = AutoConfig.from_pretrained(path, num_labels=1, trust_remote_code=trust_remote_code)
    config.classifier_dropout = 0.0  # a value is a regression target: no dropout before the head
    return AutoModelForTokenClassification.from_pretrained(
        path,
        config=config,
        dtype=DTYPES[dtype],
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )


class ModelFileError(ValueError):
    """A model folder's file that is there but cannot be read (damaged, cut short)."""


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """The tokenizer of a model folder or hub id. One saved from a plain `tokenizers` object
    (rlpost's character tokenizer: `tokenizer_class` TokenizersBackend) loads as it was saved:
    AutoTokenizer would take the class of the model's type (Qwen2Tokenizer), whose own
    pre-tokenizer drops spaces and newlines."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(path).expanduser() / "tokenizer_config.json"
    try:
        if config.is_file() and json.loads(config.read_text()).get("tokenizer_class") == "TokenizersBackend":
            tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as e:  # a hub id without the network, a folder without tokenizer files
        raise FileNotFoundError(
            f"the model {path!r} has no tokenizer to load ({str(e).strip().splitlines()[0]}): give a local "
            "folder with the model's files (or, for a hub id, a network or HF_HUB_OFFLINE=1 with a filled cache)"
        ) from None
    except Exception as e:  # noqa: BLE001  (a damaged tokenizer.json or tokenizer_config.json)
        why = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
        raise ModelFileError(
            f"the tokenizer files in {path} cannot be read ({why}): tokenizer.json or tokenizer_config.json is "
            "damaged or cut short; copy the model's files again"
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def resolve_path(path: str, cache_dir: str, log=print) -> str:
    """A local folder, or a hub id as it is; a packaged GGUF model's name or a `.gguf` file
    becomes the Hugging Face folder it is converted into (once, in `cache_dir`)."""
    from rlpost.models.gguf import ensure_converted, is_gguf

    if is_gguf(path):
        return str(ensure_converted(path, cache_dir, log))
    local = Path(path).expanduser()
    return str(local) if local.exists() else path
