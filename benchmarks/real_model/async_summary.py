#!/usr/bin/env python3
"""Issue 41's per-run summary of a collected async stage (collect.py's JSON), written into it as
`summary`: wall time between consecutive steps (the run clock, `wall_step_s`; an interval across a
resume is None and left out) from step 3 on, as a mean over the steps without validation or a
checkpoint, a mean over all steps, and a median; how long each GPU sat idle; staleness,
importance weights and dropped or regenerated groups; the held-out accuracy curve.

    python benchmarks/real_model/async_summary.py benchmarks/real_model/async_h200x4c.json --every 5 \
        --baseline sync_s0
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics


def mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.fmean(values), 3) if values else None


def summarize(run: dict, every: int) -> dict:
    """One run's figures; `every`: the steps with validation and a checkpoint (val_every, save_every)."""
    p = run["per_step"]
    steps = p["step"]
    later = [i for i, s in enumerate(steps) if s >= 3]
    walls = [(steps[i], p["wall_step_s"][i]) for i in later if p["wall_step_s"][i] is not None]
    plain = [w for s, w in walls if s % every]
    return {
        "mean_wall_step_s": mean(plain),  # the steps without validation or a checkpoint
        "mean_wall_step_all_s": mean([w for _, w in walls]),
        "median_wall_step_s": round(statistics.median(plain), 3) if plain else None,
        "intervals": len(walls),
        "mean_timing_step_s": mean([p["step_s"][i] for i in later]),
        "mean_update_s": mean([p["update_s"][i] for i in later]),
        "mean_tokens_per_s": mean([p["tokens_per_s"][i] for i in later]),
        "mean_trainer_idle_frac": mean([p["trainer_idle_frac"][i] for i in later]),
        "mean_rollout_idle_frac": mean([p["rollout_idle_frac"][i] for i in later]),
        "mean_staleness": mean([p["staleness_mean"][i] for i in later]),
        "is_weight_mean": mean([p["is_weight_mean"][i] for i in later]),
        "is_weight_max": max((p["is_weight_max"][i] for i in later if p["is_weight_max"][i] is not None), default=None),
        "regenerated_groups": sum(p["regenerated_groups"][i] or 0 for i in range(len(steps))),
        "dropped_groups": sum(p["dropped_groups"][i] or 0 for i in range(len(steps))),
        "attempts": run["attempts"],
        "val_accuracy": run["val_accuracy"],
    }


def step_seconds(run: dict) -> list[float]:
    """Each step's wall time (`wall_step_s`), or across a resume (None) the step's own timer."""
    p = run["per_step"]
    return [w if w is not None else s for w, s in zip(p["wall_step_s"], p["step_s"], strict=True)]


def minutes_to(run: dict, target: float) -> float | None:
    """Minutes of the run clock until the first held-out evaluation at `target` accuracy or more
    (each step's `wall_step_s`, validation and checkpoints in it; across a resume, where it is None,
    the step's own timer); None if no evaluation reached it."""
    at = dict(zip(run["per_step"]["step"], itertools.accumulate(step_seconds(run))))
    reached = [step for step, acc in run["val_accuracy"] if acc >= target]
    return round(at.get(reached[0], 0.0) / 60, 2) if reached else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--every", type=int, required=True, help="val_every (= save_every) of the runs")
    parser.add_argument("--baseline", required=True, help="the run the speed-ups are against")
    args = parser.parse_args()
    data = json.load(open(args.file))
    runs = {name: summarize(run, args.every) for name, run in data["runs"].items()}
    base = runs[args.baseline]
    for figures in runs.values():
        for key in ("mean_wall_step_s", "mean_wall_step_all_s"):
            figures[f"speedup_{key}"] = round(base[key] / figures[key], 3) if figures[key] else None
    target = data["runs"][args.baseline]["val_accuracy"][-1][1]  # the baseline's final accuracy
    for name, figures in runs.items():
        figures["minutes_to_baseline_final"] = minutes_to(data["runs"][name], target)
        figures["minutes_total"] = round(sum(step_seconds(data["runs"][name])) / 60, 2)
    what = summarize.__doc__ + " " + minutes_to.__doc__ + " " + __doc__.split("\n\n")[0]
    data["summary"] = {"what": what, "baseline": args.baseline, "baseline_final_accuracy": target, "runs": runs}
    with open(args.file, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
