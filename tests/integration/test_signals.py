"""Preemption: SIGTERM (what Slurm, Kubernetes and spot machines send) or Ctrl-C finishes the step
under way, writes a checkpoint, says how to go on and exits 128 + signal with no traceback and no
process left behind; the run then resumes from that checkpoint. A second signal stops at once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def command(tiny_cache, run_dir, *extra):
    return [
        sys.executable,
        "-m",
        "rlpost.cli",
        "train",
        "+recipe=quickstart",
        f"model.cache_dir={tiny_cache}",
        "model.tiny.warmup_steps=30",
        f"run.dir={run_dir}",
        "data.train_batch_size=8",
        "rollout.n=4",
        "data.val_size=32",
        "trainer.val_every=0",
        "trainer.total_steps=40",
        "logger.progress_bar=false",
        *extra,
    ]


def start_and_wait_for_step(cmd, run_dir, step, timeout=240, session=False):
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=session
    )
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics.is_file() and any(json.loads(line)["step"] >= step for line in metrics.read_text().splitlines()):
            return proc, psutil.Process(proc.pid).children(recursive=True)
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before step {step}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no step {step} within {timeout} s")


def assert_all_gone(processes, grace=20.0):
    deadline = time.monotonic() + grace
    alive = processes
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.5)
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"


# out of CI for time (56 s): the SIGTERM stop with an intact checkpoint is the process-group test's
# below, a resume that ends where an uninterrupted run ends is tests/integration/test_resume.py's
@pytest.mark.demo
@pytest.mark.timeout(600)
def test_sigterm_checkpoints_and_the_run_resumes_from_there(tiny_cache, tmp_path):
    run_dir = tmp_path / "run"
    proc, children = start_and_wait_for_step(command(tiny_cache, run_dir), run_dir, 2)
    assert children, "Ray's processes should be children of the run"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in err and "SIGTERM received" not in err
    [line] = [x for x in out.splitlines() if x.startswith("stopped by SIGTERM after step")]
    step = int(line.split("after step ")[1].split()[0])
    assert f"checkpoint {run_dir / 'checkpoints' / f'step_{step}'}" in line and "trainer.resume=auto" in line
    assert (run_dir / "checkpoints" / f"step_{step}" / "controller.pt").is_file()
    assert_all_gone(children)

    resumed = subprocess.run(
        command(tiny_cache, run_dir, "trainer.resume=auto", f"trainer.total_steps={step + 2}"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{step}'}" in resumed.stdout
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s > 0] == list(range(1, step + 3))  # each step once


@pytest.mark.demo  # out of CI for time: a single SIGTERM to the run is checked above (checkpoint and resume)
@pytest.mark.timeout(300)
def test_sigterm_to_the_whole_process_group_also_stops_cleanly_and_at_once(tiny_cache, tmp_path):
    """`timeout`, Slurm and `kill -- -PGID` signal every process of the group, Ray's own too: the
    run stops with the step's checkpoint, or, when the workers died within the step, names the
    newest one; either way it exits 143 at once instead of waiting a minute for a GCS that is gone."""
    import re

    from rlpost.controller.checkpoint import damage

    run_dir = tmp_path / "run"
    cmd = command(tiny_cache, run_dir, "trainer.save_every=1")
    proc, children = start_and_wait_for_step(cmd, run_dir, 2, session=True)
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert time.monotonic() - start < 30
    assert "Traceback" not in err and "Failed to connect to GCS" not in err
    [line] = [x for x in out.splitlines() if x.startswith("stopped by SIGTERM ")]
    found = re.match(r"stopped by SIGTERM (after step \d+|during step \d+, .*) \(checkpoint (\S+)\); to go on", line)
    assert found, line
    assert damage(Path(found.group(2))) is None
    assert_all_gone(children)


@pytest.mark.demo  # out of CI for time (a run to step 2)
@pytest.mark.timeout(400)
def test_a_killed_controller_leaves_no_process_behind(tiny_cache, tmp_path):
    """kill -9 of the controller (no handler runs): Ray's GCS, raylet, agents and every actor of
    the run go too. Ray's own detection of the dead driver took about a minute and left its dashboard
    and runtime-env agents alive (the fourteenth catalogue); the run's watcher (controller/reaper.py),
    one of the processes listed, stops them within seconds and then ends."""
    run_dir = tmp_path / "run"
    proc, children = start_and_wait_for_step(command(tiny_cache, run_dir), run_dir, 2, session=True)
    names = {p.name() for p in children}
    assert {"gcs_server", "raylet"} <= names and any(n.startswith("ray::") for n in names), names
    assert any("rlpost.controller.reaper" in " ".join(p.cmdline()) for p in children), names  # the watcher
    proc.kill()
    proc.wait()
    assert_all_gone(children, grace=30)


SLOW_REWARD = """
import time

def slow(sample):
    time.sleep(0.1)  # a step scores 32 samples: 3 s
    return 0.0
"""


@pytest.mark.demo  # out of CI for time: tests/test_bad_inputs.py checks the second signal's KeyboardInterrupt
@pytest.mark.timeout(600)
def test_a_second_ctrl_c_stops_at_once(tiny_cache, tmp_path):
    run_dir = tmp_path / "run"
    (tmp_path / "slow.py").write_text(SLOW_REWARD)
    cmd = command(tiny_cache, run_dir, "trainer.save_every=1000", f"reward.fn={tmp_path / 'slow.py'}:slow")
    proc, children = start_and_wait_for_step(cmd, run_dir, 1)
    proc.send_signal(signal.SIGINT)  # noted: the step under way would finish ...
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)  # ... but the second one stops the run in the middle of it
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "interrupted (second SIGINT: stopping at once); the actors are shut down" in err and "Traceback" not in err
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
    assert_all_gone(children)


@pytest.mark.timeout(120)
def test_sigterm_while_the_tiny_model_is_built_stops_at_once(tmp_path):
    """Before the workers start there is no step to finish: `timeout`'s SIGTERM during a first
    run's model build stops it then (it went on building for minutes), leaving no lock."""
    run_dir, cache = tmp_path / "run", tmp_path / "empty-cache"
    cmd = command(str(cache), run_dir)
    cmd.remove("model.tiny.warmup_steps=30")  # the full warm-up: a build far longer than this test
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("building the tiny model"):
            break
    time.sleep(1.0)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert time.monotonic() - start < 20
    assert "rlpost: SIGTERM before the run started: stopping now" in err and "Traceback" not in err
    assert not (run_dir / "run.lock").exists()
    assert not any(p.name.startswith("tiny-") and (p / "config.json").exists() for p in cache.glob("*"))


SLOW_AT = '''
import os, signal, time
from pathlib import Path

def score(sample):
    """Exact match; the sample that makes the count `RLPOST_TERM_AT` sends this run SIGTERM and
    then takes two minutes (under reward.timeout_s: not a timeout)."""
    counter = Path(os.environ["RLPOST_COUNTER"])
    with counter.open("a") as f:
        f.write("x")
    if counter.stat().st_size == int(os.environ.get("RLPOST_TERM_AT", "0")):
        os.kill(os.getppid(), signal.SIGTERM)  # the reward pool's parent: the run's controller
        time.sleep(120)
    return float(sample.response.strip() == sample.ground_truth)
'''


@pytest.mark.demo  # out of CI for time (three runs); the parts: test_progress.py, test_launch.py, test_executor.py
@pytest.mark.timeout(900)
def test_sigterm_while_a_slow_reward_scores_stops_within_seconds_and_the_step_trains_on_resume(tiny_cache, tmp_path):
    """The seventh catalogue's s60: a SIGTERM while step 2's samples were scored by a slow reward
    waited for the whole step (21 minutes there). Now the scoring stops, the run stops after step
    1 with its checkpoint holding step 2's generated batch, and the resumed run trains it: steps
    2 and 3 are those of a run that was never stopped."""
    (tmp_path / "slow.py").write_text(SLOW_AT)
    extra = [f"reward.fn={tmp_path / 'slow.py'}:score", "reward.num_workers=1", "reward.timeout_s=300",
             "trainer.start_pass_k=0", "logger.samples_per_step=32", "trainer.total_steps=3"]  # fmt: skip

    def run(run_dir, term_at, *more):
        env = dict(os.environ, RLPOST_COUNTER=str(tmp_path / f"{run_dir.name}.count"), RLPOST_TERM_AT=str(term_at))
        return subprocess.run(command(tiny_cache, run_dir, *extra, *more), cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip

    start = time.monotonic()
    stopped = run(tmp_path / "stopped", 34)  # the try before the actors, then step 1: 8 x 4; the 34th: step 2
    took = time.monotonic() - start
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert "the signal stopped step 2's scoring" in stopped.stdout
    assert f"stopped by SIGTERM after step 1 (checkpoint {tmp_path / 'stopped' / 'checkpoints' / 'step_1'})" in (
        stopped.stdout
    )
    assert took < 110, took  # the slow sample alone takes 120 s
    resumed = run(tmp_path / "stopped", 0, "trainer.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    straight = run(tmp_path / "straight", 0)
    assert straight.returncode == 0, straight.stderr[-2000:]

    def samples(run_dir):
        rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
        return {s: [(r["prompt"], r["response"]) for r in rows if r["step"] == s] for s in (1, 2, 3)}

    assert samples(tmp_path / "stopped") == samples(tmp_path / "straight")
