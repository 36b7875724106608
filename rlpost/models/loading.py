"""Load a causal LM and its tokenizer from a hub id or a local folder, or build the tiny one.

`model.path=tiny` resolves to a folder in `model.cache_dir` holding a Qwen2-style model and a
character tokenizer, built and warm-started on the offline arithmetic task the first time and
reused afterwards. The folder is written under a temporary name and renamed when complete, so an
interrupted build is never mistaken for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_causal_lm(path: str, dtype: str, attn_implementation: str = "sdpa",
                   trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    if attn_implementation == "rlpost_varlen":
        from rlpost.models import varlen

        varlen.register()
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[dtype], attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tiny_model_dir(model_cfg, data_cfg) -> Path:
    """Cache folder of the tiny model for these settings (content-addressed)."""
    spec = {"tiny": asdict(model_cfg.tiny), "digits": data_cfg.arithmetic_digits,
            "val_size": data_cfg.val_size, "format": 1}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return Path(model_cfg.cache_dir).expanduser() / f"tiny-qwen2-{digest}"


def ensure_tiny_model(model_cfg, data_cfg, log=print) -> Path:
    """Build, warm up and cache the tiny model unless a complete copy is cached already."""
    from transformers import Qwen2ForCausalLM

    from rlpost.data.tasks import arithmetic_split
    from rlpost.models.tiny import build_char_tokenizer, tiny_qwen2_config, warm_up

    final = tiny_model_dir(model_cfg, data_cfg)
    if (final / "config.json").is_file():
        return final
    t = model_cfg.tiny
    log(f"building the tiny model into {final} (first run only)")
    start = time.time()
    torch.manual_seed(t.seed)
    tokenizer = build_char_tokenizer()
    config = tiny_qwen2_config(len(tokenizer), t.hidden_size, t.num_layers, t.num_heads,
                               t.num_kv_heads, t.intermediate_size, t.max_position,
                               tokenizer.pad_token_id, tokenizer.eos_token_id)
    model = Qwen2ForCausalLM(config)
    train_rows, _ = arithmetic_split(data_cfg.arithmetic_digits, seed=0, num_val=data_cfg.val_size)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        warm_up(model, tokenizer, train_rows, t.warmup_steps, t.warmup_batch_size, t.warmup_lr,
                t.seed, schedule_steps=t.warmup_schedule_steps, log=log)
    finally:
        torch.set_num_threads(threads)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(final)
    except OSError:  # another process finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"tiny model ready ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
        f"{time.time() - start:.0f}s)")
    return final


def resolve_model_path(model_cfg, data_cfg, log=print) -> str:
    if model_cfg.path == "tiny":
        return str(ensure_tiny_model(model_cfg, data_cfg, log=log))
    local = Path(model_cfg.path).expanduser()
    return str(local) if local.exists() else model_cfg.path
