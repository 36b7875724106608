#!/usr/bin/env python3
"""Issue 36 item 4: merged LoRA's rollout/trainer log-prob gap against full fine-tuning's over every
step of every H200 run of `smollm2_sums` (40 steps each, one run per seed and mode; a seed measured
twice counts once), not run by run. Seed by seed (`gap_compare.py`) the largest gap of a run is one
token; pooled, the question is whether the two modes' per-step figures come from one distribution:

- per mode: steps, quantiles of the per-step maximum, how many steps pass 1, 1.5 and 2 nats;
- Mann-Whitney U (two-sided) on the per-step maximum, 99.9th percentile and mean gap; Fisher's exact
  test on the steps past 1.5 nats;
- the mean gap and the median per-step maximum by the policy's entropy (a LoRA run learns more slowly,
  so more of its steps are at high entropy, where every token's gap is larger).

    PYTHONPATH=. python benchmarks/real_model/gap_pool.py --out benchmarks/real_model/gap_pool.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from scipy.stats import fisher_exact, mannwhitneyu

from benchmarks.provenance import with_provenance

HERE = Path(__file__).parent
RUNS = {  # (file, run): the H200 runs of smollm2_sums that logged the entropy; seed 3's LoRA run from its first file
    "full": [
        ("gap_h200x2.json", "gap_s1"),
        ("gap_h200x2b.json", "gap_s3"),
        ("gap_h200x2b.json", "gap_s8"),
        ("gap_h200x4b.json", "gap_s6"),
        ("gap_h200x4b.json", "gap_s7"),
        ("algos_h200x4.json", "grpo_s0"),
    ],
    "lora": [
        ("gap_h200x2.json", "gap_lora_s1"),
        ("gap_h200x2b.json", "gap_lora_s3"),
        ("gap_h200x2b.json", "gap_lora_s8"),
        ("gap_h200x4b.json", "gap_lora_s6"),
        ("gap_h200x4b.json", "gap_lora_s7"),
    ],
}
KEYS = ("entropy", "logprob_gap_max", "logprob_gap_p999", "logprob_gap_mean")
ENTROPY_BINS = (0.0, 0.05, 0.1, 0.3, 0.6, 1.0, 1.5, 2.0, 3.0)


def steps(mode: str) -> list[dict]:
    """One dict per step (KEYS) over the mode's runs."""
    rows = []
    for file, run in RUNS[mode]:
        per_step = json.loads((HERE / file).read_text())["runs"][run]["per_step"]
        rows += [{k: per_step[k][i] for k in KEYS} for i in range(len(per_step["step"]))]
    return rows


def summary(rows: list[dict]) -> dict:
    top = [r["logprob_gap_max"] for r in rows]
    q = statistics.quantiles(top, n=20)
    return {
        "steps": len(rows),
        "step_max_median": round(statistics.median(top), 3),
        "step_max_p90": round(q[17], 3),
        "step_max_p95": round(q[18], 3),
        "largest": round(max(top), 3),
        "steps_past": {f"{t}": sum(x > t for x in top) for t in (1.0, 1.5, 2.0)},
        "mean_gap": round(statistics.mean(r["logprob_gap_mean"] for r in rows), 5),
        "mean_entropy": round(statistics.mean(r["entropy"] for r in rows), 3),
    }


def by_entropy(rows: list[dict]) -> list[dict]:
    out = []
    for lo, hi in zip(ENTROPY_BINS, ENTROPY_BINS[1:]):
        inside = [r for r in rows if lo <= r["entropy"] < hi]
        if inside:
            out.append(
                {
                    "entropy": [lo, hi],
                    "steps": len(inside),
                    "mean_gap": round(statistics.mean(r["logprob_gap_mean"] for r in inside), 5),
                    "step_max_median": round(statistics.median(r["logprob_gap_max"] for r in inside), 3),
                    "largest": round(max(r["logprob_gap_max"] for r in inside), 3),
                }
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rows = {mode: steps(mode) for mode in RUNS}
    values = {m: {k: [r[k] for r in rows[m]] for k in KEYS} for m in RUNS}
    tests = {k: round(float(mannwhitneyu(values["full"][k], values["lora"][k]).pvalue), 4) for k in KEYS[1:]}
    top = {m: values[m]["logprob_gap_max"] for m in RUNS}
    past = [[sum(x > 1.5 for x in top[m]), sum(x <= 1.5 for x in top[m])] for m in RUNS]
    record = {
        "runs": {mode: [f"{f}:{r}" for f, r in RUNS[mode]] for mode in RUNS},
        "summary": {mode: summary(rows[mode]) for mode in RUNS},
        "mann_whitney_p": tests,
        "fisher_p_steps_past_1.5": round(float(fisher_exact(past).pvalue), 4),
        "by_entropy": {mode: by_entropy(rows[mode]) for mode in RUNS},
    }
    a.out.write_text(json.dumps(with_provenance(record), indent=1) + "\n")
    print(json.dumps(record["summary"]), json.dumps(tests))


if __name__ == "__main__":
    main()
