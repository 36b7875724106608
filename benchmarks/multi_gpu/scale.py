#!/usr/bin/env python3
"""The SmolLM2 recipe on 1, 2 and 4 GPUs (benchmarks/real_model/gpu.sh x4, unpacked) as one JSON:
every sums run as benchmarks/real_model/collect.py records it, each run's memory plan against its
measured update peak (scripts/plan_vs_measured.py, here, with the GPU's size), and per world size
the step time after warm-up, the validation curve over seeds and the speed-up over one GPU.

    python benchmarks/multi_gpu/scale.py /tmp/gpu/x4 --gpu-gib 140.4 --out benchmarks/multi_gpu/scale_h200x4.json \
        --command "COMMIT=1dc2fa8 bash benchmarks/real_model/gpu.sh x4 (3 calls)"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "real_model"))
sys.path.insert(0, str(REPO))

from collect import machine, run_record, started, train_command  # noqa: E402

WARM_UP = 5  # steps left out of the step time: compilation, the allocator's first growth


def plan_of(folder: Path, command: str, gpu_gib: float, extra: list[str]) -> dict:
    overrides = [w for w in command.split("rlpost train ", 1)[1].split() if not w.startswith("trainer.resume")]
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "plan_vs_measured.py"), str(folder), *overrides, *extra],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, GPU_GIB=str(gpu_gib)),
    )
    d = json.loads(out.stdout)
    return {
        "plan_update_peak_gib": d["plan_gib"]["peak"],
        "measured_update_peak_gib": d["measured_update_peak_gib"],
        "plan_over_measured": d["plan_over_measured"],
        # the plan sizes micro-batches by full-length rows; a run whose answers stay short never fills them
        "plan_at_measured_microbatch_over_measured": d["plan_at_measured_tokens_over_measured"],
        "plan_gpu_peak_gib": d["plan_gpus_gib"],  # the whole GPU: trainer and vLLM, without CUDA contexts
    }


def gpu_peaks(stage: Path, name: str) -> dict[str, float]:
    """nvidia-smi's peak memory (GiB) of each of the run's GPUs while it ran (the sampler of
    gpu.sh, every 0.5 s): CUDA contexts, the allocators' caches and the sleeping engine included."""
    lines = (stage / "commands.txt").read_text().splitlines()
    start = next(m for m in (re.match(rf"^(\S+) start {re.escape(name)} on GPU ([\d,]+):", x) for x in lines) if m)
    end = next(x.split()[0] for x in lines if x.split()[1:2] == [f"{name}"] and " rc=" in x)
    gpus, peaks = start.group(2).split(","), {}
    for line in (stage / "gpu_memory.csv").read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1] in gpus and start.group(1) <= parts[0][-12:-4] <= end:
            peaks[parts[1]] = max(peaks.get(parts[1], 0.0), float(parts[2]) / 1024)
    return peaks


def world_summary(runs: dict[str, dict]) -> dict:
    steps = [statistics.median(r["per_step"]["step_s"][WARM_UP:]) for r in runs.values()]
    curves = [dict(r["val_accuracy"]) for r in runs.values()]
    shared = sorted(set.intersection(*(set(c) for c in curves)))
    return {
        "runs": sorted(runs),
        "median_step_s": steps,
        "median_step_s_mean": statistics.mean(steps),
        "val_accuracy_mean": [[s, statistics.mean(c[s] for c in curves)] for s in shared],
        "final_val_accuracy": [c[max(c)] for c in curves],
        "tokens_per_s_median": [statistics.median(r["per_step"]["tokens_per_s"][WARM_UP:]) for r in runs.values()],
    }


def resume_record(stage: Path, name: str, runs: dict[str, dict]) -> dict:
    """A checkpoint saved at one world size going on at another (`wA_to_wB`, trainer.resume=@RUN/...):
    the step it resumed from (the run's log), the saving run's accuracy there, and the resumed run's
    steps: accuracy, reward and whether every sync was verified."""
    log = (stage / f"{name}.log").read_text(errors="replace")
    m = re.search(r"resumed from (\S+) \(step (\d+)", log)
    source = m.group(1).split("/")[-3] if m else None
    step = int(m.group(2)) if m else None
    curve = dict(runs[source]["val_accuracy"]) if source in runs else {}
    r = runs[name]
    return {
        "from_run": source,
        "from_step": step,
        "val_accuracy_at_save": curve.get(step),
        "val_accuracy_after": r["val_accuracy"],
        "steps": r["per_step"]["step"],
        "reward": r["per_step"]["reward"],
        "every_sync_verified": all(v == 1.0 for v in r["per_step"]["sync_verified"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", type=Path)
    p.add_argument("--gpu-gib", type=float, required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--note", default="")
    p.add_argument("--as-run", nargs="*", default=[], help="overrides that give the config as the runs had it")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    commands = {
        n: train_command(*job) for n, job in started(a.stage).items() if re.match(r"sums_w\d_s\d$|w\d_to_w\d$", n)
    }
    runs = {}
    for name, command in commands.items():
        record = run_record(a.stage, name, command)
        if record["finished"]:
            memory = {"as_run": plan_of(a.stage / name, command, a.gpu_gib, a.as_run)}
            memory["this_tree"] = plan_of(a.stage / name, command, a.gpu_gib, [])
            memory["nvidia_smi_peak_gib"] = gpu_peaks(a.stage, name)
            runs[name] = record | {"memory": memory}
    worlds = {
        w: world_summary({n: r for n, r in runs.items() if n.startswith(f"sums_w{w}_")})
        for w in (1, 2, 4)
        if any(n.startswith(f"sums_w{w}_") for n in runs)
    }
    for w, s in worlds.items():  # a speed-up only against 1 GPU of the same machine
        s["speed_up_over_1_gpu"] = worlds[1]["median_step_s_mean"] / s["median_step_s_mean"] if 1 in worlds else None
    resumed = {n: resume_record(a.stage, n, runs) for n in runs if "_to_" in n}
    out = {**machine(a.stage), "command": a.command, "note": a.note, "by_world_size": worlds, "resumed": resumed}
    out["runs"] = runs
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    for w, s in worlds.items():
        print(w, round(s["median_step_s_mean"], 3), s["speed_up_over_1_gpu"], s["final_val_accuracy"])
    for n, r in runs.items():
        m = r["memory"]
        plan = m["this_tree"]
        print(n, round(plan["plan_over_measured"], 3), plan["plan_gpu_peak_gib"], m["nvidia_smi_peak_gib"])


if __name__ == "__main__":
    main()
