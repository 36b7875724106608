#!/usr/bin/env python3
"""The log-prob pass on one GPU, A/B in one process: (A) a separate log-prob pass over the batch,
then the update with those old log-probs; (B) the update that takes them from its own forward
(`algo.old_logprobs=auto`). Alternating rounds, the first one untimed; medians.

    python benchmarks/old_logprobs/bench_logprob_ab.py /tmp/qwen2-0.5b --reps 8 --out logprob_ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from provenance import with_provenance  # noqa: E402


def setting(model_dir: str) -> list[str]:
    """The config of the colocate GRPO run of benchmarks/gpu_session.sh, on one GPU."""
    return [
        f"model.path={model_dir}",
        "model.dtype=bfloat16",
        "model.attn_implementation=rlpost_varlen",
        "trainer.device=cuda",
        "trainer.world_size=1",
        "data.train_batch_size=32",
        "rollout.n=8",
        "rollout.max_response_length=256",
        "trainer.micro_batch_size=256",
        "trainer.max_tokens_per_microbatch=8192",
        "trainer.optim.lr=1e-6",
    ]


def random_batch():
    """Its batch: 32 prompts x 8 samples, 32 + 256 random tokens each."""
    from rlpost.data.batch import Batch

    g = torch.Generator().manual_seed(0)
    rows, prompt, response = 256, 32, 256
    return Batch(
        {
            "prompt_ids": torch.randint(100, 20000, (rows, prompt), generator=g),
            "prompt_mask": torch.ones(rows, prompt, dtype=torch.bool),
            "response_ids": torch.randint(100, 20000, (rows, response), generator=g),
            "response_mask": torch.ones(rows, response, dtype=torch.bool),
            "loss_mask": torch.ones(rows, response, dtype=torch.bool),
            "rollout_logprobs": torch.full((rows, response), -2.0),
            "advantages": torch.randn(rows, generator=g),
        }
    )


def alternate(worker, shard, reps: int) -> dict[str, list[float]]:
    """`reps` timed rounds after an untimed one, (A) then (B) in each: the seconds of each part."""
    times: dict[str, list[float]] = {"separate_logprob": [], "separate_update": [], "separate": [], "fused": []}

    def timed(fn):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        return out, time.perf_counter() - start

    for rep in range(reps + 1):  # the first round warms up (CUDA kernels, allocator)
        logprobs, t_lp = timed(lambda: worker.compute_logprobs(shard))
        with_old = shard.select(slice(None))
        with_old["old_logprobs"] = logprobs["old_logprobs"][torch.argsort(logprobs["row_index"])]
        _, t_up = timed(lambda: worker.update(with_old))
        _, t_fused = timed(lambda: worker.update(shard))
        if rep:
            times["separate_logprob"].append(t_lp)
            times["separate_update"].append(t_up)
            times["separate"].append(t_lp + t_up)
            times["fused"].append(t_fused)
    return times


def gpu_logprob_ab(model_dir: str, reps: int) -> dict:
    """On one GPU, in one process, alternating: (A) a separate log-prob pass, then the update with
    those old log-probs; (B) the update that takes them from its own forward. The batch of the
    colocate GRPO run of benchmarks/gpu_session.sh: 32 prompts x 8 samples, 32 + 256 tokens each."""
    from rlpost.config import load_config
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.roles.actor import ActorWorker
    from rlpost.weightsync.transport import free_port

    overrides = setting(model_dir)
    cfg = load_config(overrides)
    batch = random_batch()
    shard = shard_batch(batch, step_plan(batch, cfg)[1])[0]
    worker = ActorWorker(cfg, model_dir, 0, 1, "127.0.0.1", free_port())
    times = alternate(worker, shard, reps)
    worker.shutdown()
    med = {k: round(statistics.median(v), 4) for k, v in times.items()}
    return {
        "setting": overrides,
        "reps": reps,
        "median_s": med,
        "fused_vs_separate": round(med["fused"] / med["separate"], 3),
        "gpu": torch.cuda.get_device_name(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    script = "benchmarks/old_logprobs/bench_logprob_ab.py"
    result = {"command": f"python {script} {args.model_dir} --reps {args.reps} --out {args.out}"}
    result.update(gpu_logprob_ab(args.model_dir, args.reps))
    result = with_provenance(result)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
