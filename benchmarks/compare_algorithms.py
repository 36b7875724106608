#!/usr/bin/env python3
"""Every algorithm's recipe on the CPU quickstart task, side by side: per seed one tiny start model
(built once, shared by all recipes of that seed, so each algorithm starts from the same weights)
and one run per recipe, each timed from the command line to the end. Writes the held-out greedy
accuracy curves and the final gains as JSON, and beside it their picture (`rlpost plot` of the JSON).

    python benchmarks/compare_algorithms.py --seeds 0 1 --out benchmarks/algorithms.json
    python benchmarks/compare_algorithms.py --recipes quickstart gspo --seeds 0 --out /tmp/a.json trainer.total_steps=20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from provenance import with_provenance  # noqa: E402
from quickstart_seeds import cpu_model, train  # noqa: E402
from summarize_run import summarize  # noqa: E402

from rlpost.metrics.plot import plot_json  # noqa: E402

RECIPES = ["quickstart", "ppo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "dapo", "gspo", "cispo", "grpo_rm"]


def run(recipe: str, seed: int, cache: Path, run_dir: Path, extra: list[str]) -> dict:
    cmd, proc, wall = train(recipe, seed, run_dir, cache, extra)
    if proc.returncode != 0:
        return {"recipe": recipe, "seed": seed, "error": proc.stderr[-3000:], "wall_s": round(wall, 1)}
    s = summarize(str(run_dir), skip=0)
    curve = s["val_accuracy"]
    return {
        "recipe": recipe,
        "seed": seed,
        "val_accuracy": curve,
        "start_accuracy": curve[0][1],
        "end_accuracy": curve[-1][1],
        "gain": curve[-1][1] - curve[0][1],
        "steps_s": round(s["phase_s"].get("step", 0.0), 1),
        # off-policy within a batch (several optimizer steps a batch): ratios leave 1, clipping acts
        "ratio_max_mean": s["mean"].get("actor/ppo_ratio_max"),
        "ratio_min_mean": s["mean"].get("actor/ppo_ratio_min"),
        "clipfrac_mean": s["mean"].get("actor/pg_clipfrac"),
        "wall_s": round(wall, 1),
        "command": " ".join(cmd[1:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", nargs="+", default=RECIPES)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*", help="more config overrides for every run")
    args = ap.parse_args()
    git = partial(subprocess.run, capture_output=True, text=True, cwd=REPO)
    commit = git(["git", "rev-parse", "--short", "HEAD"])
    dirty = git(["git", "status", "--porcelain", "rlpost", "recipes"])
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            cache = Path(tmp) / f"cache{seed}"  # the first recipe builds the seed's start model
            for recipe in args.recipes:
                r = run(recipe, seed, cache, Path(tmp) / f"{recipe}-{seed}", args.overrides)
                results.append(r)
                print(json.dumps({k: r.get(k) for k in ("recipe", "seed", "end_accuracy", "gain", "wall_s", "error")}))
    summary = {}
    for recipe in args.recipes:
        ok = [r for r in results if r["recipe"] == recipe and "error" not in r]
        summary[recipe] = {
            "runs": len(ok),
            "mean_gain": statistics.fmean(r["gain"] for r in ok) if ok else None,
            "min_gain": min((r["gain"] for r in ok), default=None),
            "mean_end_accuracy": statistics.fmean(r["end_accuracy"] for r in ok) if ok else None,
        }
    out = {
        "command": f"python benchmarks/compare_algorithms.py --recipes {' '.join(args.recipes)} --seeds "
        f"{' '.join(map(str, args.seeds))} --out {args.out}" + "".join(f" {o}" for o in args.overrides),
        "commit": commit.stdout.strip() + ("+changes" if dirty.stdout.strip() else ""),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "summary": summary,
        "runs": results,
    }
    Path(args.out).write_text(json.dumps(with_provenance(out), indent=1) + "\n")
    plot_json(args.out)  # the curves (one line per seed, a colour per recipe) and the gains, as a PNG beside it
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
