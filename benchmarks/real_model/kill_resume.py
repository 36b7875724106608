#!/usr/bin/env python3
"""Issue 41 item 4 on the GPUs: an `rlpost train` run killed with SIGKILL (its whole process group:
the controller, its Ray and every actor) once it has logged step `--kill-after`, then resumed
with `trainer.resume=auto`; then every prompt it trained counted against an uninterrupted run of
the same command (`--reference`, its run folder). A job of benchmarks/gpu_queue.py:

    kill_async2_s0 2 sh: python3 benchmarks/real_model/kill_resume.py --dir $W --name kill_async2_s0 \
        --kill-after 7 --reference $W/async2_s0 -- $ASYNC algo.async_rollouts=true ...

Both runs must log every sample (`logger.samples_per_step` at least prompts x n). Later calls of
the queue go on with the resume (the kill is done once: NAME.killed records it). Writes
NAME.killed (step, what was left running ten seconds after the kill) and NAME.count.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path


def logged_steps(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return 0
    return max((json.loads(line).get("step", 0) for line in path.read_text().splitlines() if line.strip()), default=0)


def left_running(pgid: int) -> list[str]:
    """The processes still in the killed run's process group (a Ray process that escaped it too)."""
    out = subprocess.run(["ps", "-eo", "pid,pgid,args"], capture_output=True, text=True).stdout.splitlines()[1:]
    return [line.strip()[:160] for line in out if line.split()[1] == str(pgid)]


def kill_once(cmd: list[str], run: Path, after: int, record: Path) -> None:
    """Start the run, SIGKILL its process group once step `after` is logged, record what was left."""
    again = ["trainer.resume=auto"] if any((run / "checkpoints").glob("step_*")) else []  # stopped before the kill
    proc = subprocess.Popen([*cmd, *again], start_new_session=True)
    signal.signal(signal.SIGTERM, lambda *_: (os.killpg(proc.pid, signal.SIGTERM), sys.exit(143)))  # the deadline
    while logged_steps(run) < after:
        if proc.poll() is not None:
            raise SystemExit(f"the run ended (rc {proc.returncode}) before step {after}: nothing was killed")
        time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(10)
    mine = os.environ.get("CUDA_VISIBLE_DEVICES", "")  # the run's GPUs: what the killed processes held on them
    smi = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader", *(["-i", mine] if mine else [])]
    gpus = subprocess.run(smi, capture_output=True, text=True).stdout.split("\n") if shutil.which(smi[0]) else []
    killed = {"after_step": logged_steps(run), "left_in_group": left_running(proc.pid),
              "gpu_memory_after": [g for g in gpus if g.strip()]}  # fmt: skip
    record.write_text(json.dumps(killed, indent=1) + "\n")
    print("killed:", killed, flush=True)


def resume(cmd: list[str]) -> int:
    """The resumed run in the foreground; a SIGTERM (the queue's deadline) is passed on to it."""
    proc = subprocess.Popen([*cmd, "trainer.resume=auto"])
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    return proc.wait()


def prompts_by_step(run: Path, n: int) -> dict[int, list[str]]:
    """{step: the step's prompts in order}: samples.jsonl has each prompt's n samples in a row."""
    steps: dict[int, list[str]] = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], []).append(row["prompt"])
    return {s: p[::n] for s, p in sorted(steps.items())}


def count(run: Path, reference: Path | None, n: int) -> dict:
    mine = prompts_by_step(run, n)
    seen = Counter(p for prompts in mine.values() for p in prompts)
    out = {"steps": sorted(mine), "prompts_trained": sum(seen.values()), "distinct": len(seen),
           "trained_more_than_once": sorted(p for p, k in seen.items() if k > 1)[:5]}  # fmt: skip
    if reference is not None and (reference / "samples.jsonl").is_file():
        theirs = prompts_by_step(reference, n)
        common = sorted(set(mine) & set(theirs))
        out["reference"] = str(reference)
        out["steps_compared"] = len(common)
        out["steps_with_other_prompts"] = [s for s in common if mine[s] != theirs[s]]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--kill-after", type=int, required=True, help="kill once this step is logged")
    p.add_argument("--reference", type=Path, help="the uninterrupted run's folder")
    p.add_argument("--n", type=int, default=8, help="samples a prompt (rollout.n)")
    p.add_argument("overrides", nargs="+")
    a = p.parse_args()
    run = a.dir / a.name
    cmd = [sys.executable, "-m", "rlpost.cli", "train", *a.overrides, f"run.dir={run}"]
    record = a.dir / f"{a.name}.killed"
    if not record.exists():
        kill_once(cmd, run, a.kill_after, record)
    rc = resume(cmd)
    if rc == 0:
        result = count(run, a.reference, a.n)
        (a.dir / f"{a.name}.count.json").write_text(json.dumps(result, indent=1) + "\n")
        print("count:", result, flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
