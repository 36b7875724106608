#!/usr/bin/env python3
"""Issue 36 item 4: merged LoRA's rollout/trainer log-prob gap against full fine-tuning's, seed by
seed, over the steps both runs of a seed have. Reads JSON written by collect.py (runs named
`gap_sN` and `gap_lora_sN`, from one stage or several) and writes them together with a
`comparison` per seed: the largest gap over the run, the mean of the per-step mean gaps, the
median of the per-step maxima and, where the runs logged it, the largest per-step 99.9th
percentile and both sides' log-prob of the token at the largest gap.

    python benchmarks/real_model/gap_compare.py /tmp/x4k.json /tmp/algos.json --out gap.json --note "..."
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path


def side(steps: dict, n: int) -> dict:
    """The figures of one run over its first `n` steps."""
    rows = [{k: v[i] for k, v in steps.items()} for i in range(n)]
    top = max(rows, key=lambda r: r["logprob_gap_max"])
    out = {
        "max": round(top["logprob_gap_max"], 3),
        "max_at_step": top["step"],
        "mean": round(statistics.mean(r["logprob_gap_mean"] for r in rows), 5),
        "median_step_max": round(statistics.median(r["logprob_gap_max"] for r in rows), 3),
    }
    if all(r.get("logprob_gap_p999") is not None for r in rows):
        out["p999_max"] = round(max(r["logprob_gap_p999"] for r in rows), 3)
        out["max_token_logprobs"] = {  # the token at the largest gap: the rollout's and the trainer's
            "rollout": round(top["logprob_gap_max_rollout_logprob"], 2),
            "trainer": round(top["logprob_gap_max_trainer_logprob"], 2),
        }
    if top.get("logprob_gap_max_token") is not None:  # which token: its id and its place in its response
        out["max_token"] = {"id": int(top["logprob_gap_max_token"]), "position": int(top["logprob_gap_max_position"])}
    return out


def compare(runs: dict) -> dict:
    """Per seed with both runs: full fine-tuning's figures, LoRA's, and LoRA over full."""
    out = {}
    for name in sorted(runs):
        m = re.fullmatch(r"gap_s(\d+)", name)
        lora = runs.get(f"gap_lora_s{m.group(1)}") if m else None
        if lora is None:
            continue
        full = runs[name]
        n = min(len(full["per_step"]["step"]), len(lora["per_step"]["step"]))
        a, b = side(full["per_step"], n), side(lora["per_step"], n)
        ratios = {f"{k}_ratio": round(b[k] / a[k], 2) for k in ("max", "mean", "median_step_max", "p999_max") if k in a}
        out[f"seed_{m.group(1)}"] = {"steps": n, "full": a, "lora": b, **ratios}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("collected", nargs="+", type=Path, help="JSON files written by collect.py")
    p.add_argument("--note", default="")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    files = [json.loads(f.read_text()) for f in args.collected]
    runs = {}
    for f in files:
        for name, run in f["runs"].items():
            runs[name] = {**run, "commit": run.get("commit", f["commit"]), "stage_command": f["command"]}
    head = {k: files[0][k] for k in ("commit", "machine", "date", "gpus", "cpu_cores", "software")}
    command = " ; ".join(f["command"] for f in files)
    doc = {**head, "command": command, "note": args.note, "runs": runs, "comparison": compare(runs)}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
