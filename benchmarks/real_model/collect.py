#!/usr/bin/env python3
"""One stage of benchmarks/real_model/gpu.sh (its archive, unpacked) as the committed JSON: the
machine, commit, command and date the stage recorded; per run its recipe, seed, whether it
finished (or the last line of its error), the start model's headroom, the validation curve, and
per step the reward, response length, gradient norm, rollout/trainer log-prob gap, tokens/s and
step time; the headroom survey, where the stage ran one.

    python benchmarks/real_model/collect.py /tmp/gpu/sums --out benchmarks/real_model/sums_h100.json \
        --command "COMMIT=... bash benchmarks/real_model/gpu.sh sums"
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rlpost.metrics.summary import read_metrics

PER_STEP = {
    "reward": "reward/mean",
    "response_length": "response_length/mean",
    "grad_norm": "actor/grad_norm",
    "logprob_gap_max": "rollout/logprob_diff_max",
    "logprob_gap_mean": "rollout/logprob_diff_mean",
    "logprob_gap_p999": "rollout/logprob_diff_p999",  # the three below: None in runs before 2026-11-27
    "logprob_gap_max_rollout_logprob": "rollout/logprob_diff_max_rollout_logprob",
    "logprob_gap_max_trainer_logprob": "rollout/logprob_diff_max_trainer_logprob",
    "logprob_gap_max_token": "rollout/logprob_diff_max_token",  # these two: None in runs before 2026-11-28
    "logprob_gap_max_position": "rollout/logprob_diff_max_position",
    "tokens_per_s": "perf/tokens_per_s",
    "step_s": "timing_s/step",
    "update_peak_gb": "perf/update_peak_gb",
    "sync_verified": "weight_sync/verified",
    "gen_s": "timing_s/gen",
    "update_s": "timing_s/update",
    "sync_s": "timing_s/weight_sync",
    "sync_bytes": "weight_sync/bytes",
    "asleep_gpu_used_gb": "rollout/asleep_gpu_used_gb",  # the device right after vLLM slept (from 2026-11-27)
    "entropy": "actor/entropy",
    "pg_clipfrac": "actor/pg_clipfrac",  # the three below: whether the PPO ratio ever left 1 (issue 40 item 3)
    "ppo_ratio_max": "actor/ppo_ratio_max",
    "ppo_ratio_min": "actor/ppo_ratio_min",
    "run_s": "time/run_s",  # the rest: issue 41's async runs (run_s: from 2026-11-28)
    "staleness": "rollout/staleness",
    "staleness_mean": "async/staleness_mean",
    "is_weight_mean": "rollout_corr/is_weight_mean",
    "is_weight_max": "rollout_corr/is_weight_max",
    "regenerated_groups": "async/regenerated_groups",
    "dropped_groups": "async/dropped_groups",
    "trainer_idle_frac": "perf/trainer_idle_frac",
    "rollout_idle_frac": "perf/rollout_idle_frac",
}


def machine(stage: Path) -> dict:
    lines = (stage / "machine.txt").read_text().splitlines()
    gpus = [line for line in lines if "," in line and "MiB" in line]
    named, cores = (f"{len(gpus)} x {gpus[0].split(',')[0]}" if gpus else "no GPU"), int(lines[2 + len(gpus) + 1])
    return {
        "commit": lines[0].removeprefix("commit "),
        "machine": f"{named}, {cores} CPU cores",
        "date": lines[2],
        "gpus": named,
        "cpu_cores": cores,
        "software": lines[-1],
    }


def run_record(stage: Path, name: str, command: str) -> dict:
    folder = stage / name
    rows = read_metrics(folder)  # one row a step: a step written twice (a resumed attempt) counts once
    steps = [r for r in rows if r.get("step", 0) > 0 and "timing_s/step" in r]
    log_text = (stage / f"{name}.log").read_text(errors="replace")
    attempts = log_text.split("\n==== attempt at ")
    log = attempts[-1]  # gpu_queue.py appends each call's attempt; the last one says how the run ended
    errors = [line for line in log.splitlines() if re.match(r"^\w*(Error|Exception)\b", line.strip())]
    stopped = [line for line in log.splitlines() if line.startswith("stopped by")]  # SIGTERM: the call's time limit
    finished = "summary:" in log and not errors and not stopped
    return {
        "command": command,
        "finished": finished,
        "attempts": max(len(attempts) - 1, 1),
        "error": None if finished else (errors or stopped or log.strip().splitlines())[-1].strip(),
        "start": {k.removeprefix("start/"): v for k, v in rows[0].items() if k.startswith("start/")},
        "val_accuracy": [[r["step"], r["val/accuracy"]] for r in rows if "val/accuracy" in r],
        "steps": len(steps),
        "per_step": {"step": [r["step"] for r in steps]}
        | {key: [r.get(metric) for r in steps] for key, metric in PER_STEP.items()}
        | {"wall_step_s": wall_steps(steps, resumed_at(log_text))},
    }


def resumed_at(log: str) -> set[int]:
    """The steps a run's attempts resumed from (`resumed from ... (step N, ...)` in its log)."""
    return {int(m) for m in re.findall(r"^resumed from .*\(step (\d+),", log, flags=re.M)}


def wall_steps(steps: list[dict], resumed: set[int] = frozenset()) -> list[float | None]:
    """Each step's wall time: its `time/run_s` less the step before's, validation and checkpoint
    included (None for the first step, after a gap, where the clock is missing, or for the first step
    of an attempt resumed from the step before: its interval holds the new process's start).
    `timing_s/step` was not the whole of it: an async run's wait for the engines' memory fell
    outside it (async_h200x4.json)."""
    out: list[float | None] = [None]
    for before, row in zip(steps, steps[1:]):
        t0, t1 = before.get("time/run_s"), row.get("time/run_s")
        ok = t0 is not None and t1 is not None and row["step"] == before["step"] + 1 and t1 > t0
        out.append(t1 - t0 if ok and before["step"] not in resumed else None)
    return out


def started(stage: Path) -> dict[str, tuple[str, list[str]]]:
    """Each run's GPUs and overrides from the start lines of commands.txt: its last attempt's, less
    the `trainer.resume=auto` that gpu_queue.py adds to a run going on in a later call (a first
    attempt may have been refused and its job line fixed before the run went on). A job that ran
    `rlpost train` through run_7b.sh has its overrides in NAME.overrides, which that script writes;
    one that ran it as a shell job (`VAR=value python3 -m rlpost.cli train ...`), those after `train`
    (its variables: `shell_env`)."""
    out = {}
    for line in (stage / "commands.txt").read_text().splitlines():
        m = re.match(r"^\S+ start (\S+) on GPU ([\d,]+): (.*)$", line)
        if m:
            name, words = m.group(1), m.group(3).split()
            if "benchmarks/real_model/run_7b.sh" in words and (stage / f"{name}.overrides").is_file():
                words = (stage / f"{name}.overrides").read_text().split()
            if "rlpost.cli" in words and "train" in words:
                words = words[words.index("train") + 1 :]
            out[name] = (m.group(2), [w for w in words if w != "trainer.resume=auto"])
    return out


def shell_env(stage: Path) -> dict[str, str]:
    """Each shell job's variables set before its `python3 -m rlpost.cli train` (e.g. PyTorch's allocator)."""
    out = {}
    for line in (stage / "commands.txt").read_text().splitlines():
        m = re.match(r"^\S+ start (\S+) on GPU [\d,]+: (.*?)python3 -m rlpost\.cli train ", line)
        if m and m.group(2).strip():
            out[m.group(1)] = m.group(2).strip()
    return out


def train_command(gpus: str, overrides: list[str], env: str = "") -> str:
    return f"CUDA_VISIBLE_DEVICES={gpus} {env + ' ' if env else ''}rlpost train {' '.join(overrides)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", type=Path, help="an unpacked stage folder of gpu.sh")
    p.add_argument("--command", required=True, help="the command that ran the stage")
    p.add_argument("--note", default="", help="what a reader must know about this stage")
    p.add_argument("--commit", help="the commit whose tree ran, where the stage recorded another")
    p.add_argument("--runs", nargs="*", help="only these runs (default: every run of the stage)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    env = shell_env(a.stage)
    commands = {
        n: train_command(*job, env.get(n, "")) for n, job in started(a.stage).items() if a.runs is None or n in a.runs
    }
    out = {
        **machine(a.stage),
        **({"commit": a.commit} if a.commit else {}),
        "command": a.command,
        "note": a.note,
        "runs": {name: run_record(a.stage, name, cmd) for name, cmd in commands.items()},
    }
    survey = a.stage / "headroom.jsonl"
    if survey.is_file():
        seen, rows = set(), []
        for line in survey.read_text().splitlines():
            row = json.loads(line)
            key = (row["task"], tuple(row["set"]))
            if key not in seen:  # a stage run twice on one machine appends its survey again
                seen.add(key)
                rows.append(
                    {k: v for k, v in row.items() if not k.startswith("example")} | {"sample": row["example_sample"]}
                )
        out["headroom"] = rows
    a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
