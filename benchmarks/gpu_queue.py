#!/usr/bin/env python3
"""Runs a list of `rlpost train` jobs over the GPUs of one machine until a deadline, so that a set
of runs larger than one 10-minute device call goes on over several calls on the same warm machine.

    python3 benchmarks/gpu_queue.py JOBS [JOBS...] --dir /tmp/runs/x4 --deadline 540 --common "model.cache_dir=..."

JOBS has one job a line, `NAME GPUS overrides...` (`#` starts a comment). Jobs start in their
order, each on the lowest-numbered GPUs that are free; a job waits for the one before it to start
(so a 4-GPU job is not starved by 1-GPU jobs behind it). `$VAR` in a line is the environment's
(overrides that several jobs share). A job that finished before (`NAME.done`)
is skipped; one with checkpoints in its run folder goes on from them (`trainer.resume=auto`), one
whose folder an earlier attempt left without a checkpoint starts again (that folder kept as
NAME.attemptN: rlpost refuses a run folder that holds another run's steps). An
override `@NAME/...` names a path in another job's run folder; the job waits for that job. A job
`NAME GPUS sh: COMMAND...` runs a shell command instead (the GPU tests beside the runs). At the
deadline every job still running gets one SIGTERM (the run stops after its step, with a
checkpoint) and `--grace` seconds to write it. Each attempt's output is appended to `NAME.log`;
`commands.txt` says when each job started where, and how each attempt ended.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from pathlib import Path


def read_jobs(path: Path) -> list[tuple[str, int, list[str]]]:
    jobs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        words = os.path.expandvars(line.split("#", 1)[0]).split()
        if any("$" in w for w in words):
            raise SystemExit(f"{path} line {n}: set the variable first (not in the environment): {line!r}")
        if words:
            if len(words) < 2 or not words[1].isdigit():
                raise SystemExit(f"{path} line {n}: want `NAME GPUS overrides...`, got {line!r}")
            jobs.append((words[0], int(words[1]), words[2:]))
    return jobs


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return len([line for line in out.splitlines() if line.startswith("GPU ")])


def note(root: Path, text: str) -> None:
    line = f"{time.strftime('%H:%M:%S', time.gmtime())} {text}"
    print(line, flush=True)
    with open(root / "commands.txt", "a") as f:
        f.write(line + "\n")


def command(root: Path, name: str, overrides: list[str], common: list[str]) -> list[str] | None:
    """The job's command line, or None while a job it names (`@NAME/...`) has not finished."""
    if overrides[:1] == ["sh:"]:
        return ["bash", "-c", " ".join(overrides[1:])]
    args = []
    for o in overrides:
        if "=@" in o:
            key, ref = o.split("=@", 1)
            if not (root / f"{ref.split('/')[0]}.done").exists():
                return None
            o = f"{key}={root / ref}"
        args.append(o)
    run = root / name
    if any((run / "checkpoints").glob("step_*")):
        args.append("trainer.resume=auto")
    elif run.exists():  # an attempt stopped before its first checkpoint: start again, keeping its folder
        aside = (root / f"{name}.attempt{n}" for n in range(1, 1000))
        run.rename(next(p for p in aside if not p.exists()))
    return ["python3", "-m", "rlpost.cli", "train", *args, *common, f"run.dir={run}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("jobs", type=Path, nargs="+", help="job lists, run as one list in their order")
    p.add_argument("--dir", type=Path, required=True, help="where the run folders and logs go")
    p.add_argument("--deadline", type=float, required=True, help="seconds from now")
    p.add_argument("--grace", type=float, default=50.0, help="seconds after the SIGTERM")
    p.add_argument("--min-start", type=float, default=120.0, help="start nothing with less time left")
    p.add_argument("--common", default="", help="overrides every job gets")
    p.add_argument("--gpus", type=int, help="how many GPUs (default: as many as nvidia-smi lists)")
    p.add_argument("--stagger", type=float, default=15.0, help="seconds between two starts (each starts a Ray)")
    a = p.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    end, free = time.monotonic() + a.deadline, list(range(a.gpus or gpu_count()))
    todo = [j for path in a.jobs for j in read_jobs(path) if not (a.dir / f"{j[0]}.done").exists()]
    running: dict[str, tuple[subprocess.Popen, list[int]]] = {}
    last_start = -float("inf")
    while (todo or running) and time.monotonic() < end:
        for name, (proc, gpus) in list(running.items()):
            if proc.poll() is not None:
                note(a.dir, f"{name} rc={proc.returncode}")
                if proc.returncode == 0:
                    (a.dir / f"{name}.done").touch()
                free = sorted(free + gpus)
                del running[name]
        while todo and len(free) >= todo[0][1] and end - time.monotonic() > a.min_start:
            if time.monotonic() - last_start < a.stagger:
                break
            name, count, overrides = todo[0]
            cmd = command(a.dir, name, overrides, a.common.split())
            if cmd is None:
                break
            gpus, free = free[:count], free[count:]
            shown = cmd[2] if cmd[0] == "bash" else " ".join(cmd[4 : len(cmd) - 1 - len(a.common.split())])
            running[name] = (launch(a.dir, name, cmd, gpus, shown), gpus)
            last_start = time.monotonic()
            todo.pop(0)
        time.sleep(2)
    stop(a.dir, running, a.grace)


def launch(root: Path, name: str, cmd: list[str], gpus: list[int], shown: str) -> subprocess.Popen:
    where = ",".join(map(str, gpus))
    note(root, f"start {name} on GPU {where}: {shown}")
    log = open(root / f"{name}.log", "a")
    log.write(f"\n==== attempt at {time.strftime('%FT%TZ', time.gmtime())}\n")
    log.flush()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=where)
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(root: Path, running: dict, grace: float) -> None:
    """The deadline: one SIGTERM to each run's own process (its workers stop with it after the
    step), then, after `grace` seconds, SIGKILL to what is left of its process group."""
    for name, (proc, _) in running.items():
        note(root, f"{name}: deadline, SIGTERM")
        proc.send_signal(signal.SIGTERM)
    until = time.monotonic() + grace
    for name, (proc, _) in running.items():
        try:
            proc.wait(max(until - time.monotonic(), 1))
            note(root, f"{name} rc={proc.returncode}")
            if proc.returncode == 0:
                (root / f"{name}.done").touch()
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            note(root, f"{name}: killed after the grace period")


if __name__ == "__main__":
    main()
