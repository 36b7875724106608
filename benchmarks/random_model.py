#!/usr/bin/env python3
"""A Qwen2-shaped model with random weights and rlpost's character tokenizer (padded to the
model's vocabulary), saved as a Hugging Face folder: for GPU benchmarks on machines that cannot
download a model. Shapes follow the public Qwen2.5 configs. `--tokenizer DIR` takes DIR's tokenizer
instead (its vocabulary, special tokens, chat template and generation config): the shape then reads
a real task's prompts as that model does (benchmarks/peers/: SmolLM2's tokenizer on 1.5B and 7B shapes).

    python3 benchmarks/random_model.py --shape 0.5b --out /tmp/qwen2-0.5b
    python3 benchmarks/random_model.py --shape 1.5b --out /tmp/shapes/1.5b --tokenizer /tmp/rlcache/gguf-smollm2-...
    python3 benchmarks/random_model.py --shape 72b --out /tmp/qwen2-72b --config-only   # for `rlpost plan`
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlpost.tiny.model import build_char_tokenizer  # noqa: E402

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, tied embeddings
    "0.5b": (896, 4864, 24, 14, 2, True),
    "1.5b": (1536, 8960, 28, 12, 2, True),
    "3b": (2048, 11008, 36, 16, 2, True),
    "7b": (3584, 18944, 28, 28, 4, False),
    "14b": (5120, 13824, 48, 40, 8, False),
    "32b": (5120, 27648, 64, 40, 8, False),
    "72b": (8192, 29568, 80, 64, 8, False),
    "test": (128, 256, 2, 4, 2, True),  # for trying the scripts on a CPU
}


def build(
    shape: str,
    out: str,
    dtype: str = "bfloat16",
    seed: int = 0,
    config_only: bool = False,
    tokenizer: str | None = None,
) -> str:
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    hidden, inter, layers, heads, kv, tied = SHAPES[shape]
    tok = AutoTokenizer.from_pretrained(tokenizer) if tokenizer else build_char_tokenizer(151936)
    vocab = 151936 if tokenizer is None else -(-len(tok) // 64) * 64  # rows for every token id, a multiple of 64
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=4096,
        rope_theta=1e6,
        tie_word_embeddings=tied,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id if tokenizer and tok.bos_token_id is not None else tok.eos_token_id,
        torch_dtype=dtype,
    )
    if tokenizer and Path(tokenizer, "generation_config.json").is_file():  # its eos and sampling defaults
        GenerationConfig.from_pretrained(tokenizer).save_pretrained(out)
    if config_only:  # enough for `rlpost plan` and a sync's manifest: no weights to build
        config.save_pretrained(out)
        tok.save_pretrained(out)
        return out
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--config-only", action="store_true", help="config and tokenizer only (plans, manifests)")
    ap.add_argument("--tokenizer", help="a model folder whose tokenizer (and chat template) the shape takes")
    args = ap.parse_args()
    print(build(args.shape, args.out, args.dtype, config_only=args.config_only, tokenizer=args.tokenizer))
