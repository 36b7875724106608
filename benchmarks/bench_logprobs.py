#!/usr/bin/env python3
"""The trainer's token layouts side by side in one process: forward+backward of response log-probs.

A Qwen2-shaped model (random weights; default the shape of Qwen2.5-0.5B) scores a batch of
sequences whose lengths are uniform in [--min-len, --max-len] (prompt of --prompt-len tokens, the
rest response), `--group-size` consecutive sequences sharing a prompt (GRPO's n; 1: every prompt
its own). Every layout (`padded`, `shared_prompt` with sdpa, `packed` with a varlen kernel) runs
the same sequences in micro-batches of the same token budget (padded: rows are padded to the
longest of their micro-batch). Reports real tokens per second, the padding share, the max
|log-prob difference| from the padded layout, and peak memory, as JSON.

    python benchmarks/bench_logprobs.py --out benchmarks/logprobs_h100.json          # GPU
    python benchmarks/bench_logprobs.py --group-size 8 --prompt-len 256 --min-len 320 --max-len 1280
    python benchmarks/bench_logprobs.py --tiny --device cpu --attn sdpa              # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provenance import with_provenance  # noqa: E402

from rlpost.data.batch import Batch  # noqa: E402
from rlpost.data.microbatch import padding_fraction, plan_shards  # noqa: E402
from rlpost.data.padding import left_pad, right_pad, trim_padding  # noqa: E402
from rlpost.trainer.logprobs import response_logprobs  # noqa: E402


def make_model(args):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if args.tiny:
        shape = dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=1000,
        )
    else:  # Qwen2.5-0.5B
        shape = dict(
            hidden_size=896,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            intermediate_size=4864,
            vocab_size=151936,
        )
    cfg = Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(device=args.device, dtype=getattr(torch, args.dtype))
    return model


def make_batch(args, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(args.min_len, args.max_len + 1, (args.num_seqs,), generator=g).tolist()
    groups = [
        torch.randint(3, vocab, (args.prompt_len,), generator=g).tolist()
        for _ in range(0, len(lengths), args.group_size)
    ]
    prompts = [groups[i // args.group_size] for i in range(len(lengths))]
    responses = [torch.randint(3, vocab, (n - args.prompt_len,), generator=g).tolist() for n in lengths]
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    response_ids, response_mask = right_pad(responses, 0)
    return Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
        }
    )


def run(model, micro_batches: list[Batch], layout: str, sync) -> tuple[float, list[torch.Tensor]]:
    start = time.perf_counter()
    out = []
    for mb in micro_batches:
        logp, _ = response_logprobs(model, mb, 1.0, layout=layout)
        mask = mb["response_mask"].to(logp.device)
        (-(logp * mask).sum() / mask.sum()).backward()
        out.append(logp.detach())
    sync()
    return time.perf_counter() - start, out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--attn", default="auto", help="packed attention: auto, flash_attention_2, rlpost_varlen, sdpa")
    p.add_argument("--num-seqs", type=int, default=64)
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--group-size", type=int, default=1, help="consecutive sequences sharing a prompt")
    p.add_argument("--max-tokens", type=int, default=16384, help="token budget of a micro-batch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", default="")
    args = p.parse_args()
    if args.min_len <= args.prompt_len:
        p.error(f"--min-len ({args.min_len}) must exceed --prompt-len ({args.prompt_len})")
    return args


def packed_attention(attn: str) -> str:
    """The packed layout's attention: `auto` is flash_attention_2 where flash_attn is installed, else
    rlpost's varlen kernel where it is available, else sdpa; rlpost_varlen is registered first."""
    if attn == "auto":
        from rlpost.models import varlen

        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            return varlen.register() if varlen.varlen_available() else "sdpa"
    if attn == "rlpost_varlen":
        from rlpost.models import varlen

        varlen.register()
    return attn


def measure(model, micro: list[Batch], args, real_tokens: int, cuda: bool, sync) -> dict:
    """Every layout over the same micro-batches: `--repeats` timed runs after one warm-up, each
    layout's median, tokens/s, peak memory and the last run's log-probs."""
    results = {}
    layouts = (("padded", "sdpa"), ("shared_prompt", "sdpa"), ("packed", args.attn))
    for name, attn in layouts:
        model.set_attn_implementation(attn)
        times = []
        for r in range(args.repeats + 1):  # first run warms up
            model.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            seconds, logps = run(model, micro, name, sync)
            if r:
                times.append(seconds)
        median = sorted(times)[len(times) // 2]
        results[name] = {
            "attn_implementation": attn,
            "seconds_median": median,
            "seconds_all": times,
            "tokens_per_s": real_tokens / median,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "logprobs": logps,
        }
    return results


def make_report(args, model, cuda: bool, lengths: list[int], plan, micro: list[Batch], results: dict) -> dict:
    """The JSON: the setting, each layout's speed over padded's and its largest log-prob difference
    from padded's (the log-probs themselves are dropped from `results`), and `results`."""
    reference = results["padded"].pop("logprobs")
    diffs = {
        name: max(float((a.float() - b.float()).abs().max()) for a, b in zip(reference, results[name].pop("logprobs")))
        for name in ("shared_prompt", "packed")
    }
    return {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": args.dtype,
        "num_seqs": args.num_seqs,
        "group_size": args.group_size,
        "prompt_len": args.prompt_len,
        "lengths": [args.min_len, args.max_len],
        "real_tokens": sum(lengths),
        "micro_batches": len(micro),
        "max_tokens": args.max_tokens,
        "padding_fraction": padding_fraction(lengths, [plan]),
        "tokens_per_s_over_padded": {
            name: results[name]["tokens_per_s"] / results["padded"]["tokens_per_s"]
            for name in ("shared_prompt", "packed")
        },
        "max_abs_logprob_diff_from_padded": diffs,
        **results,
    }


def main() -> int:
    args = parse_args()
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = make_model(args)
    args.attn = packed_attention(args.attn)
    batch = make_batch(args, model.config.vocab_size)
    lengths = (batch["prompt_mask"].sum(-1) + batch["response_mask"].sum(-1)).tolist()
    # the same micro-batches (same rows, same token budget) for every layout
    plan = plan_shards(lengths, 1, max_tokens=args.max_tokens)[0]
    micro = [trim_padding(batch.select(rows)) for rows in plan]  # each padded to its own longest row
    results = measure(model, micro, args, sum(lengths), cuda, sync)
    text = json.dumps(with_provenance(make_report(args, model, cuda, lengths, plan, micro, results)), indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
