#!/usr/bin/env python3
"""`rlpost train +recipe=smollm2_sums_cpu` over several seeds on this CPU, one after another, each
timed from the command's start (the GGUF conversion, Ray's and vLLM's start and the start
model's pass@8 included), summarised as JSON with the commit, machine, command and date.

    python benchmarks/real_model/cpu_demo.py --seeds 1 2 --runs /tmp/cpu_demo \
        --existing 0:/tmp/cpu_demo/s0:1411 --out benchmarks/real_model/cpu_demo.json

`--existing SEED:DIR:SECONDS` adds a run made earlier by the same command (its wall time as
measured then). Nothing else should run meanwhile: the wall time is the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

RECIPE = "smollm2_sums_cpu"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def record(run_dir: Path, seconds: float) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and "timing_s/step" in r]
    val = [[r["step"], r["val/accuracy"]] for r in rows if "val/accuracy" in r]
    return {
        "wall_s": round(seconds, 1),
        "start": {k.removeprefix("start/"): v for k, v in rows[0].items() if k.startswith("start/")},
        "val_accuracy": val,
        "gain": round(max(a for _, a in val[1:]) - val[0][1], 4) if len(val) > 1 else None,
        "per_step": {
            "step": [r["step"] for r in steps],
            "reward": [r.get("reward/mean") for r in steps],
            "response_length": [r.get("response_length/mean") for r in steps],
            "grad_norm": [r.get("actor/grad_norm") for r in steps],
            "logprob_gap_max": [r.get("rollout/logprob_diff_max") for r in steps],
            "tokens_per_s": [r.get("perf/tokens_per_s") for r in steps],
            "step_s": [r.get("timing_s/step") for r in steps],
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    p.add_argument("--runs", type=Path, default=Path("/tmp/cpu_demo"))
    p.add_argument("--existing", nargs="*", default=[], help="SEED:DIR:SECONDS of runs made by the same command")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    runs = {}
    for spec in a.existing:
        seed, folder, seconds = spec.split(":")
        runs[f"seed{seed}"] = record(Path(folder), float(seconds))
    for seed in a.seeds:
        folder = a.runs / f"s{seed}"
        cmd = [
            "rlpost",
            "train",
            f"+recipe={RECIPE}",
            f"run.seed={seed}",
            f"run.dir={folder}",
            "logger.progress_bar=false",
        ]
        start = time.time()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        runs[f"seed{seed}"] = record(folder, time.time() - start)
        print(f"seed {seed}: {runs[f'seed{seed}']['val_accuracy']} in {runs[f'seed{seed}']['wall_s']} s", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {
        "commit": commit,
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "command": f"rlpost train +recipe={RECIPE} run.seed=SEED run.dir=DIR  (python {' '.join(sys.argv)})",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "runs": runs,
    }
    a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
