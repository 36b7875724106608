#!/usr/bin/env python3
"""Do runs of one recipe on different commits train bit for bit alike? Compares every logged value
of every step (rewards, losses, gradient norms, entropies, log-prob gaps, validation accuracy, sync
checks) between a reference run and the others, exact equality, leaving out only what measures
time and memory (timings, tokens/s, GB). Reads the run folders of one gpu.sh stage (its archive,
unpacked: benchmarks/real_model/jobs_x4f.txt's bit_* runs) and writes JSON with the stage's
machine, commit and date.

    python benchmarks/real_model/bitwise.py /tmp/gpu/x4f --reference bit_e329347 \
        --runs bit_7ed730e bit_head_a bit_head_b --out benchmarks/real_model/bitwise_h200.json --command "..."
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collect import machine  # noqa: E402

from rlpost.metrics.summary import read_metrics  # noqa: E402

TIME_OR_MEMORY = ("timing_s/", "perf/tokens_per_s", "_gb", "weight_sync/send_", "weight_sync/recv_")


def compared(row: dict) -> dict:
    """A metrics row less what measures time or memory (these vary between identical runs)."""
    return {k: v for k, v in row.items() if not any(part in k for part in TIME_OR_MEMORY)}


def differences(reference: list[dict], other: list[dict]) -> list[dict]:
    """Every (step, key) where the two runs logged different values, or one logged none."""
    out = []
    if len(reference) != len(other):
        out.append({"step": None, "key": "rows", "reference": len(reference), "run": len(other)})
    for a, b in zip(reference, other):
        a, b = compared(a), compared(b)
        out += [
            {"step": a.get("step"), "key": k, "reference": a.get(k), "run": b.get(k)}
            for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)
        ]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", type=Path, help="the stage's folder (machine.txt and the run folders)")
    p.add_argument("--reference", required=True)
    p.add_argument("--runs", nargs="+", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--command", required=True, help="the command that ran the stage")
    p.add_argument("--note", default="")
    a = p.parse_args()
    ref = read_metrics(a.stage / a.reference)
    out = machine(a.stage) | {"command": a.command, "note": a.note, "reference": a.reference}
    out["values_compared_per_run"] = sum(len(compared(r)) for r in ref)
    out["reference_curve"] = {
        "reward": [r["reward/mean"] for r in ref if "reward/mean" in r],
        "val_accuracy": [[r["step"], r["val/accuracy"]] for r in ref if "val/accuracy" in r],
    }
    out["runs"] = {}
    for name in a.runs:
        diffs = differences(ref, read_metrics(a.stage / name))
        out["runs"][name] = {"identical": not diffs, "differences": diffs}
        print(f"{name}: {'bit for bit' if not diffs else f'{len(diffs)} values differ'}")
    a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
