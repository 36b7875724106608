#!/usr/bin/env python3
"""Synchronous vs one-step-off-policy vs async rollouts on the quickstart task in split placement
(a trainer rank and a rollout actor on devices of their own): step throughput and the learning
curves side by side. Each mode runs from the command line on the same built tiny model (built
once per seed, first, untimed), one after the other, nothing else running.

    python benchmarks/bench_async.py --seeds 0 1 --out benchmarks/async_cpu.json
    python benchmarks/bench_async.py --seeds 0 --out /tmp/a.json trainer.total_steps=40

Throughput: training steps per second over the steps after the first (the first carries the
start-up's first generation), i.e. 1 / mean step time; the validation passes (greedy, every
`trainer.val_every` steps) are timed apart and left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from provenance import commit, with_provenance  # noqa: E402
from quickstart_seeds import cpu_model, train  # noqa: E402
from summarize_run import summarize  # noqa: E402

SPLIT = ["cluster.placement=split", "trainer.world_size=1"]
MODES = {
    "synchronous": ["algo.max_staleness=0"],
    "one_step_off": ["algo.max_staleness=1"],
    "async_k1": ["algo.async_rollouts=true", "algo.max_staleness=1"],
    "async_k2": ["algo.async_rollouts=true", "algo.max_staleness=2"],
}


def run_mode(mode: str, seed: int, workdir: Path, cache: Path, extra: list[str]) -> dict:
    run_dir = workdir / f"{mode}-{seed}"
    cmd, proc, wall = train("quickstart", seed, run_dir, cache, [*SPLIT, *MODES[mode], *extra])
    if proc.returncode != 0:
        return {"mode": mode, "seed": seed, "error": proc.stderr[-3000:]}
    s = summarize(str(run_dir), skip=1)
    steps = [t for t in s["per_step"]["timing_s/step"][1:] if t is not None]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "reward/mean" in r]
    return {
        "mode": mode,
        "seed": seed,
        "steps_per_s": len(steps) / sum(steps),
        "median_step_s": statistics.median(steps),
        "mean_gen_wait_s": s["mean"].get("timing_s/gen"),
        "mean_update_s": s["mean"].get("timing_s/update"),
        "mean_staleness": s["mean"].get("rollout/staleness"),
        "partial_samples_mean": s["mean"].get("async/partial_samples"),
        "regenerated_groups": sum(r.get("async/regenerated_groups", 0.0) for r in trained),
        "val_accuracy": s["val_accuracy"],
        "reward_mean": [[r["step"], r["reward/mean"]] for r in trained],
        "wall_s": round(wall, 1),
        "command": " ".join(cmd[1:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*", help="more config overrides for every run")
    args = ap.parse_args()
    tree = commit()  # the tree measured (+dirty: rlpost/ or benchmarks/ changed), before the runs
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            cache = Path(tmp) / f"cache{seed}"
            # build the seed's tiny model first (one step, untimed), so that no mode pays for it
            train("quickstart", seed, Path(tmp) / f"build{seed}", cache, [*SPLIT, "trainer.total_steps=1"])
            for mode in args.modes:
                r = run_mode(mode, seed, Path(tmp), cache, args.overrides)
                results.append(r)
                print(json.dumps({k: r.get(k) for k in ("mode", "seed", "steps_per_s", "error")}), flush=True)
    ok = [r for r in results if "error" not in r]
    summary = {}
    for mode in args.modes:
        runs = [r for r in ok if r["mode"] == mode]
        if runs:
            summary[mode] = {
                "steps_per_s": statistics.fmean(r["steps_per_s"] for r in runs),
                "final_val_accuracy": statistics.fmean(r["val_accuracy"][-1][1] for r in runs),
                "start_val_accuracy": statistics.fmean(r["val_accuracy"][0][1] for r in runs),
            }
    base = summary.get("synchronous", {}).get("steps_per_s")
    for mode in summary:
        if base:
            summary[mode]["throughput_vs_synchronous"] = summary[mode]["steps_per_s"] / base
    out = {
        "command": f"python benchmarks/bench_async.py --seeds {' '.join(map(str, args.seeds))} --out {args.out}"
        + (" " + " ".join(args.overrides) if args.overrides else ""),
        "commit": tree,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "summary": summary,
        "runs": results,
    }
    Path(args.out).write_text(json.dumps(with_provenance(out), indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
