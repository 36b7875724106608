#!/usr/bin/env python3
"""The worked-steps runs as one figure: held-out accuracy against minutes of training (each step's
wall time, `wall_step_s`, where the run has it: validation and checkpoints in it; else the step's
timer, evaluations left out) and the answers' mean length against the step, per run.

    python benchmarks/real_model/plot.py benchmarks/real_model/pair_h100x2.json:steps_s0 \
        benchmarks/real_model/steps_h100x2.json benchmarks/real_model/steps_lora_h100x2.json \
        --out benchmarks/real_model/steps_h100x2.png
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path


def curves(run: dict) -> tuple[list[float], list[float], list[int], list[float]]:
    """(minutes at each evaluation, accuracy there, steps, mean response length at each step)."""
    per = run["per_step"]
    walls = per.get("wall_step_s") or [None] * len(per["step_s"])  # an async step's timer missed a wait
    seconds = [w if w is not None else s for w, s in zip(walls, per["step_s"], strict=True)]
    minutes = dict(zip(per["step"], itertools.accumulate(s / 60 for s in seconds)))
    minutes[0] = 0.0
    evaluated = [(minutes[s], a) for s, a in run["val_accuracy"] if s in minutes]
    return [m for m, _ in evaluated], [a for _, a in evaluated], per["step"], per["response_length"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sources", nargs="+", help="FILE.json (every run) or FILE.json:RUN")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, length) = plt.subplots(1, 2, figsize=(11, 4))
    for source in a.sources:
        path, _, only = source.partition(":")
        for name, run in json.loads(Path(path).read_text())["runs"].items():
            if only and name != only:
                continue
            minutes, accuracy, steps, lengths = curves(run)
            style = "--" if "lora" in name else "-"
            acc.plot(minutes, accuracy, style, marker="o", label=name)
            length.plot(steps, lengths, style, label=name)
    acc.set(
        xlabel="minutes of training (steps' wall time, else their timers, summed)",
        ylabel="held-out greedy accuracy",
        ylim=(0, 1),
    )
    length.set(xlabel="step", ylabel="mean response length (tokens)")
    acc.legend(fontsize=8)
    acc.grid(alpha=0.3)
    length.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
