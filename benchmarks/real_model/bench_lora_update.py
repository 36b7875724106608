"""Why a LoRA update step costs more than full fine-tuning's on a small model (one GPU).

Times forward + backward of one micro-batch (ROWS x TOKENS, token log-probs as the update computes
them) on the same model, sharded as the trainer shards it (FSDP2, bf16 compute), with:
  full    - every weight trainable
  merge   - LoRA, the trainer computing with the merged weight (model.lora.mode=merge)
  adapter - LoRA, peft's own forward (W x + s B A x; model.lora.mode=adapter)
and writes the median time per micro-batch and the profiler's top operators of each mode to --out.

  python benchmarks/real_model/bench_lora_update.py --model smollm2-135m-instruct --out /tmp/out/lora_update.json
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from rlpost.models.loading import load_causal_lm, resolve_path
from rlpost.models.lora import apply_lora
from rlpost.trainer.fsdp import shard_model
from rlpost.trainer.lora import use_merged_forward

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from provenance import with_provenance  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def build(path: str, mode: str, rank: int):
    model = load_causal_lm(path, "float32")
    if mode != "full":
        cfg = SimpleNamespace(rank=rank, alpha=2.0 * rank, target_modules=["all-linear"])
        model = apply_lora(model, cfg)
        if mode == "merge":
            use_merged_forward(model)
    return shard_model(model, DEVICE, torch.bfloat16).train()


def micro_step(model, ids: torch.Tensor) -> None:
    logits = model(input_ids=ids).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])
    logp.mean().backward()


def measure(model, ids: torch.Tensor, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        micro_step(model, ids)
        sync()
        times.append(time.perf_counter() - start)
    return times


def top_ops(model, ids: torch.Tensor, n: int = 12) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        micro_step(model, ids)
        sync()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_device_time_total, reverse=True)[:n]
    return [
        {
            "op": e.key,
            "calls": e.count,
            "device_ms": e.self_device_time_total / 1e3,
            "cpu_ms": e.self_cpu_time_total / 1e3,
        }
        for e in rows
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/rlpost"))
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--tokens", type=int, default=176)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if DEVICE.type == "cuda" else "gloo", rank=0, world_size=1)
    path = resolve_path(args.model, args.cache)
    ids = torch.randint(0, 1000, (args.rows, args.tokens), device=DEVICE)
    result = {"model": path, "rows": args.rows, "tokens": args.tokens, "rank": args.rank, "modes": {}}
    for mode in ("full", "merge", "adapter"):
        model = build(path, mode, args.rank)
        measure(model, ids, 2)  # warm-up
        times = measure(model, ids, args.reps)
        result["modes"][mode] = {"median_s": statistics.median(times), "times_s": times, "top_ops": top_ops(model, ids)}
        print(mode, round(statistics.median(times) * 1e3, 1), "ms", flush=True)
        del model
        torch.cuda.empty_cache()
    result["device"] = torch.cuda.get_device_name(0) if DEVICE.type == "cuda" else "cpu"
    with open(args.out, "w") as f:
        json.dump(with_provenance(result), f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
