"""The run loop's rows in `metrics.jsonl`: one per step. The engines' memory at the start is
step 0's row in a new run; in a resumed run it goes with the first new step, since a row at the
step resumed from would stand for that step's own row (summaries keep one row a step; on an H200
a resumed run's memory row replaced the saved step's metrics)."""

import io
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlpost.config import load_config
from rlpost.controller import progress
from rlpost.controller.progress import run_steps
from rlpost.controller.workers import Workers
from rlpost.metrics.summary import read_metrics


class FakeController:
    """What `run_steps` asks of a controller; each step's reward is its number."""

    def __init__(self, run_dir, step: int):
        self.cfg = load_config(
            [
                "rollout.max_response_length=64",  # within the tiny model's 128 positions (the default 256 is not)
                "trainer.total_steps=3",
                "trainer.val_every=0",
                "trainer.save_every=0",
                "trainer.start_pass_k=0",
                "logger.backends=[jsonl]",
                "logger.progress_bar=false",
                f"run.dir={run_dir}",
            ]  # fmt: skip
        )
        self.step, self.run_dir, self.model_path = step, run_dir, str(run_dir)
        self.started = time.monotonic()
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "config.yaml").write_text("run: {}\n")  # (the run's, as claim_run_dir writes it)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        (Path(run_dir) / "run.lock").write_text(json.dumps(me))  # and its lock
        self.algorithm = SimpleNamespace(name="grpo")
        memory = [{"rollout/gpu_used_gb": 5.0}]
        self.workers = Workers(rollouts=SimpleNamespace(call=lambda method: memory), start_s={"time/start_ray_s": 2.0})
        self.said = []
        self.log = self.said.append

    def train_step(self):
        return {"reward/mean": float(self.step + 1), "perf/tokens": 10.0}

    def report(self):
        pass


def test_a_new_run_logs_the_engines_memory_at_step_0(tmp_path):
    c = FakeController(tmp_path, 0)
    run_steps(c)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    start = rows[0].pop("time/start_validation_s")  # the start's own validation, timed here
    assert rows[0] == {"step": 0, "rollout/gpu_used_gb": 5.0, "time/start_ray_s": 2.0}  # with the start-up's phases
    assert 0 <= start < 5
    assert c.said[0] == f"start-up {2.0 + start:.1f} s: ray 2.0 s, validation {start:.1f} s"
    assert [r["reward/mean"] for r in rows[1:]] == [1.0, 2.0, 3.0]


def test_a_run_folder_deleted_while_the_run_trains_stops_it_before_the_next_step(tmp_path):
    """The seventh catalogue's s69: the run went on into a new folder (checkpoints without a
    config.yaml, which nothing could read again) and exited 0."""
    from rlpost.controller.checkpoint import CheckpointError

    c = FakeController(tmp_path, 0)
    step = c.train_step

    def then_deleted():
        if c.step == 1:
            (tmp_path / "config.yaml").unlink()
        return step()

    c.train_step = then_deleted
    with pytest.raises(CheckpointError, match="is gone, deleted or moved after step 2 while the run trained: stopped"):
        run_steps(c)
    assert c.step == 2


def test_a_resumed_run_logs_them_with_its_first_new_step(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 1.0}\n')  # the saved run's step 1
    run_steps(FakeController(tmp_path, 1))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0] == {"step": 1, "reward/mean": 1.0}
    assert rows[1]["rollout/gpu_used_gb"] == 5.0 and rows[1]["reward/mean"] == 2.0
    assert "rollout/gpu_used_gb" not in rows[2]


# ------------------------------------------------------- the bar, the trackers, the schedule
class Scripted(FakeController):
    """A controller that records its validations, saves and stop, with a validation accuracy of
    0.5 + step / 10 and, from `signal_after` steps on, a stop signal."""

    def __init__(self, run_dir, step, *overrides, signal_after=None):
        super().__init__(run_dir, step)
        self.cfg = load_config([*self.cfg_overrides(run_dir), *overrides])
        self.validated, self.saved, self.stopped, self.signal_after = [], [], [], signal_after
        self.stop = SimpleNamespace(signal=None, restore=lambda: None)
        self.val_rows, self.passes = ["row"], []
        measured = {"start/pass@1": 0.3, "start/pass@4": 0.7}
        self.workers.batches = SimpleNamespace(
            pass_at_k=lambda rows, params: self.passes.append((rows, params)) or measured
        )
        self.said = []
        self.log = self.said.append
        self.workers.rollouts = SimpleNamespace(
            call=lambda method: [{"rollout/gpu_used_gb": 5.0}] * (method == "memory")
        )

    @staticmethod
    def cfg_overrides(run_dir):
        return ["rollout.max_response_length=64", "trainer.total_steps=3", "trainer.val_every=0",
                "trainer.save_every=0", "trainer.start_pass_k=0", "logger.backends=[jsonl]",
                "logger.progress_bar=false", f"run.dir={run_dir}"]  # fmt: skip

    def train_step(self):
        if self.signal_after is not None and self.step + 1 >= self.signal_after:
            self.stop.signal = 15
        return {**super().train_step(), "response_length/truncated_frac": 1.0}

    def validate(self):
        self.validated.append(self.step)
        return {"val/accuracy": 0.5 + self.step / 10}

    def save(self):
        self.saved.append(self.step)
        time.sleep(0.05)  # a checkpoint takes time: the run's wall time must count it

    def stop_on(self, signal):
        self.stopped.append(signal)


@pytest.fixture
def seen(monkeypatch):
    """What run_steps hands the bar, the trackers and the console: the real tqdm, recorded."""
    import tqdm as tqdm_module

    out = {"bars": [], "postfix": [], "written": [], "trackers": [], "rows": []}

    class Bar(tqdm_module.tqdm):
        def __init__(self, *args, **kwargs):
            out["bars"].append(kwargs)
            super().__init__(*args, **{**kwargs, "disable": False, "file": io.StringIO()})
            out["bar"] = self

        def set_postfix(self, **kwargs):
            out["postfix"].append(kwargs)

        @classmethod
        def write(cls, s, *args, **kwargs):
            out["written"].append(s)

    class Trackers:
        def __init__(self, *args, **kwargs):
            out["trackers"].append((args, kwargs))

        def log(self, metrics, step):
            out["rows"].append({"step": step, **metrics})

        def close(self):
            pass

    out["Bar"] = Bar
    monkeypatch.setattr(tqdm_module, "tqdm", Bar)
    monkeypatch.setattr(progress, "Trackers", Trackers)
    monkeypatch.setattr(progress, "start_eval", lambda path: {"greedy_accuracy": 0.57, "pass@8": 0.9, "n": 256})
    return out


def test_the_bar_the_trackers_and_the_console_get_the_runs_settings(tmp_path, seen, monkeypatch):
    wandb = ("logger.backends=[jsonl,wandb]", "logger.project=p1", "logger.wandb_mode=disabled")
    c = Scripted(tmp_path, 1, *wandb, "trainer.total_steps=4")
    run_steps(c, c.stop)
    bar = seen["bars"][0]
    assert bar == {"total": 4, "initial": 1, "desc": "grpo", "dynamic_ncols": True, "disable": True}
    assert seen["bar"].n == 4  # one a step, from the step resumed at
    ((args, kwargs),) = seen["trackers"]
    assert args == (["jsonl", "wandb"], tmp_path, "p1", "disabled")
    assert kwargs["config"]["logger"]["project"] == "p1" and kwargs["config"]["trainer"]["total_steps"] == 4
    assert kwargs["write"] == seen["Bar"].write  # trackers and alerts write above the bar, not into it
    assert len(seen["written"]) == 1 and "every response of step 2 reached" in seen["written"][0]  # said once
    assert [p["reward"] for p in seen["postfix"]] == ["2.000", "3.000", "4.000"]
    assert all(re.fullmatch(r"\d+\.\d\d", p["step_s"]) for p in seen["postfix"])
    assert all("val_acc" not in p for p in seen["postfix"])  # no validation: none shown
    monkeypatch.setattr(sys, "stderr", SimpleNamespace(isatty=lambda: True))  # a terminal
    c = Scripted(tmp_path / "b", 0, "logger.progress_bar=true")
    run_steps(c, c.stop)
    assert seen["bars"][1]["disable"] is False and seen["bars"][1]["initial"] == 0


def test_the_bar_shows_the_newest_validation_accuracy(tmp_path, seen):
    """Validated at the start (0.5), at step 2 (0.7) and at the last, 4 (0.9)."""
    c = Scripted(tmp_path, 0, "trainer.total_steps=4", "trainer.val_every=2")
    run_steps(c, c.stop)
    assert c.validated == [0, 2, 4]
    assert [p.get("val_acc") for p in seen["postfix"]] == ["0.500", "0.700", "0.700", "0.900"]


def test_validation_and_checkpoints_on_schedule_and_at_the_last_step(tmp_path, seen):
    c = Scripted(tmp_path, 0, "trainer.total_steps=5", "trainer.val_every=2", "trainer.save_every=3")
    run_steps(c, c.stop)
    assert c.validated == [0, 2, 4, 5] and c.saved == [3, 5]
    rows = {r["step"]: r for r in seen["rows"]}
    assert rows[2]["val/accuracy"] == 0.7 and "val/accuracy" not in rows[3]
    for step in range(1, 6):  # 10 tokens a step, in timing_s/step seconds
        t = rows[step]["timing_s/step"]
        assert 0 < t < 60 and rows[step]["perf/tokens_per_s"] == pytest.approx(10.0 / t)
    # the wall time since the start counts each step and each checkpoint (0.05 s each, at steps 3 and 5)
    since = [rows[s]["time/run_s"] for s in range(1, 6)]
    assert since == sorted(since) and since[0] >= rows[1]["timing_s/step"]
    assert since[2] - since[1] >= 0.05 and since[4] - since[3] >= 0.05


def test_a_new_runs_start_metrics_and_a_resumed_runs(tmp_path, seen):
    c = Scripted(tmp_path, 0, "trainer.start_pass_k=4", "run.seed=7", "rollout.temperature=0.8")
    run_steps(c, c.stop)
    assert seen["rows"][0] == {"step": 0, "rollout/gpu_used_gb": 5.0, "start/greedy_accuracy": 0.57,
                               "start/pass@1": 0.3, "start/pass@4": 0.7, "time/start_ray_s": 2.0,
                               "time/start_validation_s": seen["rows"][0]["time/start_validation_s"]}  # fmt: skip
    assert "rollout/gpu_used_gb" not in seen["rows"][1]
    ((rows, params),) = c.passes  # k samples of each validation row, sampled (not greedy), the run's seed
    assert rows == ["row"] and (params.n, params.greedy, params.seed, params.temperature) == (4, False, 7, 0.8)
    seen["rows"].clear()
    c = Scripted(tmp_path / "b", 1, "trainer.start_pass_k=4", "trainer.val_every=5")
    run_steps(c, c.stop)
    assert c.passes == [] and c.validated == [3]  # resumed: no start metrics, validated at the last step only
    assert not any(k.startswith("start/") for r in seen["rows"] for k in r)


def test_start_pass_k_set_is_measured_with_the_runs_sampler_also_where_the_built_model_reports_its_own(
    tmp_path, seen, monkeypatch
):
    """The fourteenth catalogue's t18: with the tiny model, trainer.start_pass_k=3 sampled nothing and
    logged the built model's own pass@1..16 without a word. Unset, the built figures stay."""
    monkeypatch.setattr(progress, "start_eval", lambda path: {"pass@1": 0.6, "pass@16": 0.9, "greedy_accuracy": 0.5})
    c = Scripted(tmp_path, 0, "trainer.start_pass_k=4")
    run_steps(c, c.stop)
    assert len(c.passes) == 1 and c.passes[0][1].n == 4
    assert {k: v for k, v in seen["rows"][0].items() if k.startswith("start/")} == {
        "start/greedy_accuracy": 0.5, "start/pass@1": 0.3, "start/pass@4": 0.7}  # fmt: skip
    assert c.said[0] == (
        "start model, 1 validation prompts, 4 samples each with the run's sampler: pass@1 0.300, pass@4 0.700"
    )
    assert c.said[1].startswith("start-up ") and len(c.said) == 2
    seen["rows"].clear()
    c = Scripted(tmp_path / "b", 0)
    run_steps(c, c.stop)
    assert c.passes == [] and seen["rows"][0]["start/pass@16"] == 0.9


def test_a_signal_stops_after_the_step_under_way_and_not_after_the_last(tmp_path, seen):
    c = Scripted(tmp_path, 0, signal_after=2)
    run_steps(c, c.stop)
    assert c.step == 2 and c.stopped == [15]
    c = Scripted(tmp_path / "b", 0, signal_after=3)  # during the last step: the run is complete
    run_steps(c, c.stop)
    assert c.step == 3 and c.stopped == []


def test_a_signal_that_stops_a_steps_scoring_stops_the_run_before_that_step(tmp_path, seen):
    """The seventh catalogue's s60: the reward pool gives a step's scoring up when a stop signal
    comes (`Interrupted`): the run stops after the step before it, which is not trained twice."""
    from rlpost.rewards.executor import Interrupted

    c = Scripted(tmp_path, 0, "trainer.total_steps=4")
    logged = []
    c.log = logged.append
    step = c.train_step

    def scoring_stopped():
        if c.step == 2:
            c.stop.signal = 15
            raise Interrupted("reward: 1 of 2 workers stopped at their share")
        return step()

    c.train_step = scoring_stopped
    run_steps(c, c.stop)
    assert c.step == 2 and c.stopped == [15]
    assert [r["step"] for r in seen["rows"]] == [0, 1, 2]  # (0: the start metrics)
    assert logged[1:] == ["the signal stopped step 3's scoring: the step is not trained"]  # (0: the start-up)


def test_a_gpu_steps_time_includes_reading_the_engines_memory(tmp_path):
    """The read came after the step's clock stopped: under async rollouts it waited for the generation
    queued on the rollout actors (seconds a step), and `timing_s/step` hid the wait (async_h200x4.json)."""
    c = FakeController(tmp_path, 1)
    c.cfg.trainer.device = "cuda"

    def slow_memory(method):
        time.sleep(0.3)
        return [{"rollout/gpu_used_gb": 5.0}]

    c.workers.rollouts.call = slow_memory
    metrics = progress.timed_step(c)
    assert metrics["timing_s/step"] >= 0.3
    assert metrics["rollout/gpu_used_gb"] == 5.0
    assert metrics["perf/tokens_per_s"] == pytest.approx(10.0 / metrics["timing_s/step"])


def test_output_to_a_file_gets_a_line_a_step_not_the_bars_frames(tmp_path, capsys):
    """The ninth catalogue's n38: with the console sent to a file, the bar wrote its `\r` frames there."""
    c = FakeController(tmp_path, 0)
    c.cfg.logger.progress_bar = True
    run_steps(c)  # capsys: neither stream is a terminal
    out, err = capsys.readouterr()
    assert "\r" not in out + err
    lines = [line for line in out.splitlines() if " step " in line]
    assert [line.split(", step_s ")[0] for line in lines] == [f"grpo step {n}/3: reward {n}.000" for n in (1, 2, 3)]


def test_a_signal_during_the_runs_report_lets_it_finish_and_shut_down(tmp_path, capsys):
    """The eleventh catalogue's t97 (HANG): `run_steps` put the previous handlers back before the report (summary.json,
    curves.png, the console's summary) and the shutdown: a SIGTERM then killed the process, with
    the lock left and Ray's agents orphaned. The handlers now stay until the caller's shutdown,
    and a signal after the last step only says so."""
    import os
    import signal

    from rlpost.controller.progress import run_steps
    from rlpost.controller.signals import StopSignals

    outside = []  # the handler before the run's (the default would end pytest on the old code)
    before = signal.signal(signal.SIGTERM, lambda signum, frame: outside.append(signum))
    c, stop, reported = FakeController(tmp_path, 0), StopSignals(), []
    stop.before_start = False
    c.report = lambda: os.kill(os.getpid(), signal.SIGTERM) or reported.append(True)  # the signal in the report
    try:
        assert run_steps(c, stop) == tmp_path
        assert reported == [True] and c.step == 3 and stop.signal == signal.SIGTERM and not outside
        assert signal.getsignal(signal.SIGTERM) == stop._note  # kept for the shutdown after it
    finally:
        stop.restore()
        signal.signal(signal.SIGTERM, before)
    assert "SIGTERM as the run ends: finishing its summary and shutdown" in capsys.readouterr().err


def test_a_lock_deleted_under_the_run_is_taken_again_and_one_another_run_took_stops_it(tmp_path):
    """The fourteenth catalogue's t29: run.lock deleted by hand, a second run with
    run.overwrite=true deleted the live run's files and both wrote into one folder, neither said."""
    from rlpost.controller.checkpoint import CheckpointError
    from rlpost.controller.progress import check_run_folder

    c, said = FakeController(tmp_path, 0), []
    lock = tmp_path / "run.lock"
    lock.unlink()
    check_run_folder(tmp_path, 2, said.append)
    assert json.loads(lock.read_text())["pid"] == os.getpid()  # this run's again
    assert said == [
        f"{lock} was deleted while the run trained (after step 2): taken again; delete it only when no run is on"
    ]
    check_run_folder(tmp_path, 3, said.append)  # held: nothing said
    assert len(said) == 1 and c.step == 0
    lock.write_text(json.dumps({"pid": 1, "host": socket.gethostname(), "since": 0}))  # another run took it
    with pytest.raises(CheckpointError, match=r"run.lock was taken by another run \(pid 1 on host .*\) while this one"):
        check_run_folder(tmp_path, 4, said.append)


def test_a_split_steps_idle_shares_and_the_wall_time_since_the_start(tmp_path):
    """`timed_step` adds each side's idle share on a split run (from the step's own metrics) and the
    run's wall time since its start, not a sum with the start's clock reading."""
    c = FakeController(tmp_path, 1)
    c.cfg.cluster.placement = "split"
    c.started = time.monotonic() - 5.0  # the run started 5 s ago
    metrics = progress.timed_step(c)
    assert metrics["perf/rollout_idle_frac"] == 1.0 and 0.0 <= metrics["perf/trainer_idle_frac"] <= 1.0
    assert 5.0 <= metrics["time/run_s"] < 60.0


def test_a_lock_deleted_during_the_run_is_said_and_taken_again(tmp_path, capsys):
    """`run.lock` deleted by hand after step 1: the run says so on its console line and goes on."""
    c = FakeController(tmp_path, 0)
    step = c.train_step

    def deleting_the_lock():
        if c.step == 1:
            (tmp_path / "run.lock").unlink()
        return step()

    c.train_step = deleting_the_lock
    run_steps(c)
    out, err = capsys.readouterr()
    assert c.step == 3 and f"{tmp_path / 'run.lock'} was deleted while the run trained (after step 2)" in out + err
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
