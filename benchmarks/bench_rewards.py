#!/usr/bin/env python3
"""Scoring a batch of samples in the reward pool (worker processes, per-sample timeouts) against
scoring it serially in the controller's own process, as rlpost did before the pool, side by side.

Four reward functions of different cost on 512 samples of the quickstart task: the built-in
`arithmetic` (a string comparison) and `gsm8k` with `method=flexible` (a regular expression),
which are trusted and scored in the controller's process; and two user functions, which run in
the pool's processes: the same string comparison (`user_cheap`: the pool's fixed cost alone) and
one that spends about a millisecond of arithmetic per sample (a verifier of some weight). Medians of
`--reps` rounds after one warm-up round; the pool's workers are started before timing.

    python benchmarks/bench_rewards.py --out benchmarks/rewards_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from provenance import with_provenance  # noqa: E402
from quickstart_seeds import cpu_model  # noqa: E402

HEAVY = """
def cheap(sample):
    return float(sample.response.strip() == sample.ground_truth.strip())


def heavy(sample):
    total = 0
    for i in range(20000):  # about a millisecond of Python
        total += i * i % 7
    return float(sample.response.strip() == sample.ground_truth.strip())
"""


def samples(n: int):
    from rlpost.data.tasks import arithmetic_split
    from rlpost.rewards import RewardInput

    rows, _ = arithmetic_split(2, seed=0, num_val=256)
    return [
        RewardInput(r["prompt"], r["ground_truth"] if i % 2 else "000", r["ground_truth"], "arithmetic")
        for i, r in enumerate(rows[:n])
    ]


def serial(spec: str, kwargs: dict, batch) -> list[float]:
    """The old way: each sample in this process, a failure scoring 0."""
    from rlpost.rewards import get_reward_fn

    fn = get_reward_fn(spec)
    out = []
    for s in batch:
        try:
            out.append(float(fn(s, **kwargs)))
        except Exception:  # noqa: BLE001
            out.append(0.0)
    return out


def median_s(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    from rlpost.rewards.pool import RewardPool

    batch = samples(args.samples)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "heavy.py").write_text(HEAVY)
        cases = {
            "arithmetic": ("arithmetic", {}),
            "gsm8k_flexible": ("gsm8k", {"method": "flexible"}),
            "user_cheap": (f"{tmp}/heavy.py:cheap", {}),
            "heavy_1ms": (f"{tmp}/heavy.py:heavy", {}),
        }
        for name, (spec, kwargs) in cases.items():
            row = {"serial_ms": round(1000 * median_s(lambda: serial(spec, kwargs, batch), args.reps), 3)}
            want = serial(spec, kwargs, batch)
            for workers in (1, 2):
                pool = RewardPool(spec, kwargs, workers, timeout_s=30, memory_mb=4096, error_score=0.0)
                try:
                    assert pool.score(batch).scores == want, name  # the same scores
                    row[f"pool{workers}_ms"] = round(1000 * median_s(lambda: pool.score(batch), args.reps), 3)
                finally:
                    pool.close()
                row[f"pool{workers}_vs_serial"] = round(row[f"pool{workers}_ms"] / row["serial_ms"], 3)
            results[name] = row
            print(name, row, flush=True)
    out = {
        "command": f"python benchmarks/bench_rewards.py --out {args.out} --samples {args.samples} --reps {args.reps}",
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "samples": args.samples,
        "median_of": args.reps,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(with_provenance(out), indent=1) + "\n")


if __name__ == "__main__":
    main()
