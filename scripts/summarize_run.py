#!/usr/bin/env python3
"""Summarise a run folder's metrics.jsonl as JSON: per metric, the mean and max over the
training steps after the first `--skip` (warm-up), every step's value of a few keys, the
validation curve, the start model's pass@k (tiny models) and the seconds spent in each phase;
run as a script, with the commit, machine, command and date on top (benchmarks/provenance.py).

    python3 scripts/summarize_run.py runs/a --skip 1 > summary.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

PER_STEP = (
    "timing_s/step",
    "timing_s/gen",
    "timing_s/logprob",
    "timing_s/update",
    "timing_s/weight_sync",
    "rollout/logprob_diff_max",
    "rollout/logprob_diff_mean",
    "rollout/staleness",
    "weight_sync/send_s",
)


def summarize(run_dir: str, skip: int) -> dict:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and "timing_s/step" in r]
    kept = steps[skip:]
    keys = sorted({k for r in kept for k, v in r.items() if isinstance(v, (int, float))})
    out = {
        "run_dir": str(run_dir),
        "steps": len(steps),
        "summarized_steps": [r["step"] for r in kept],
        "start": next((r for r in rows if r.get("step") == 0), {}),  # rollout memory, first validation
        "mean": {},
        "max": {},
        "per_step": {},
    }
    for k in keys:
        values = [r[k] for r in kept if k in r]
        out["mean"][k] = statistics.fmean(values)
        out["max"][k] = max(values)
    for k in PER_STEP:
        out["per_step"][k] = [r.get(k) for r in steps]
    out["val_accuracy"] = [[r["step"], r["val/accuracy"]] for r in rows if "val/accuracy" in r]
    out["start_model"] = {k[len("start/") :]: v for k, v in out["start"].items() if k.startswith("start/")}
    out["phase_s"] = {
        k[len("timing_s/") :]: sum(r.get(k, 0.0) for r in rows)
        for k in sorted({k for r in rows for k in r if k.startswith("timing_s/")})
    }
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--skip", type=int, default=1, help="leading steps left out of mean/max (warm-up)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from provenance import with_provenance

    print(json.dumps(with_provenance(summarize(args.run_dir, args.skip)), indent=2))
