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
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the new head is meant: transformers' report of it was noise a critic worker
    try:  # (the ninth catalogue's n29), and taught users to skip the one that matters (a reward model's, n63)
        return AutoModelForTokenClassification.from_pretrained(
            path,
            config=config,
            dtype=DTYPES[dtype],
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
        )
    finally:
        hf_logging.set_verbosity(level)


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
    if len(tokenizer.get_vocab()) <= len(tokenizer.all_special_tokens):  # a folder without tokenizer files:
        # transformers 5 builds one of its special tokens only from config.json's model_type, and every prompt
        # became no tokens (the seventeenth catalogue's t82)
        raise ModelFileError(
            f"{path} has no tokenizer files (tokenizer.json, tokenizer_config.json, or the vocabulary files of the "
            "model's tokenizer): copy them from the model its weights came from"
        )
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
    if local.exists():
        return str(local)
    check_hub_reachable(path)
    return path


def check_hub_reachable(repo_id: str, timeout_s: float = 5.0) -> None:
    """A hub id that is not in the Hugging Face cache needs the hub: without a network transformers
    retries for about a minute and then speaks of a missing tokenizer. Said at once instead (with
    HF_HUB_OFFLINE=1, where the cache is all there is, without asking the network)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a hub id at all: transformers says so itself, at once
        return
    if cached:
        return
    if constants.HF_HUB_OFFLINE:  # (the sixteenth catalogue's t101: said to be without a tokenizer, and told to
        raise FileNotFoundError(  # set the HF_HUB_OFFLINE=1 that was set)
            f"the model {repo_id!r} is not a local folder nor in the Hugging Face cache, and HF_HUB_OFFLINE=1 is "
            f"set, so the hub is not asked: give a local folder with the model's files, or download it where there "
            f"is a network (`huggingface-cli download {repo_id}` fills the cache), or unset HF_HUB_OFFLINE"
        )
    url = urlparse(constants.ENDPOINT)
    try:
        port = url.port or (80 if url.scheme == "http" else 443)
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError as e:
        raise FileNotFoundError(
            f"the model {repo_id!r} is not a local folder nor in the Hugging Face cache, and {constants.ENDPOINT} "
            f"cannot be reached ({e.strerror or type(e).__name__}): give a local folder with the model's files, or "
            "download it where there is a network (`huggingface-cli download` fills the cache)"
        ) from None
