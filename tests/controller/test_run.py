"""`train`'s handling of errors: a checkpoint that fails because the signal took the workers too
still stops cleanly (the CI failure of a SIGTERM sent to the whole process group), and an actor
that dies while writing one restarts the run."""

import signal
from pathlib import Path

import pytest
import ray

from rlpost.config import TrainConfig
from rlpost.controller import run as run_module
from rlpost.controller.checkpoint import CheckpointError
from rlpost.controller.signals import Stopped


def checkpoint_error_from_a_dead_actor() -> CheckpointError:
    try:
        try:
            raise ray.exceptions.RayActorError()
        except ray.exceptions.RayError as cause:
            raise CheckpointError("writing checkpoint step_3 failed") from cause
    except CheckpointError as e:
        return e


class FakeController:
    calls: list = []
    run_dir = Path("run")

    def __init__(self, cfg, log, restarts, stop, started):
        self.stop, self.restarts, self.run_dir, self.step = stop, restarts, FakeController.run_dir, 3
        assert not stop.finishing  # (after a restart too: its signals stop it again)
        FakeController.calls.append(("start", restarts))

    def run(self, stop):
        if self.restarts == 0:
            if FakeController.signal:
                stop.signal = signal.SIGTERM
            raise checkpoint_error_from_a_dead_actor()
        return "done"

    def stop_on(self, signum, workers_gone=False):
        FakeController.calls.append(("stop", signum, workers_gone))
        raise Stopped(signum)

    def dead_actors(self):
        return ["trainer 0"]

    def shutdown(self):  # a signal during it is said and the shutdown finishes (the twelfth catalogue's t187)
        FakeController.calls.append(("shutdown",) if self.stop.finishing else ("shutdown while signals stop it",))


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(run_module, "Controller", FakeController)
    FakeController.calls = []
    yield FakeController


def test_a_checkpoint_lost_with_the_workers_to_a_signal_stops_cleanly(fake):
    fake.signal = True
    with pytest.raises(Stopped) as stopped:
        run_module.train(TrainConfig(), log=lambda *_: None)
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    assert fake.calls == [("start", 0), ("stop", signal.SIGTERM, True), ("shutdown",)]


def test_an_actor_lost_while_writing_a_checkpoint_restarts_the_run(fake):
    fake.signal = False
    cfg = TrainConfig()
    cfg.trainer.max_restarts = 1
    assert run_module.train(cfg, log=lambda *_: None) == "done"
    assert fake.calls == [("start", 0), ("shutdown",), ("start", 1), ("shutdown",)]


def test_is_ray_error_follows_the_cause():
    assert run_module.is_ray_error(checkpoint_error_from_a_dead_actor())
    assert not run_module.is_ray_error(CheckpointError("disk full"))


def test_a_signal_before_the_workers_start_stops_at_once(capsys):
    """While a model is built or the data read there is no step to finish: the first signal stops
    the run then (a tiny model's first build went on for minutes after `timeout`'s SIGTERM)."""
    import os

    from rlpost.controller.signals import StopSignals

    stop = StopSignals()
    try:
        with pytest.raises(Stopped) as info:
            os.kill(os.getpid(), signal.SIGTERM)
        assert info.value.exit_code == 128 + signal.SIGTERM and stop.signal == signal.SIGTERM
        assert capsys.readouterr().err == "\nrlpost: SIGTERM before the run started: stopping now\n"
    finally:
        stop.restore()


def test_a_start_that_fails_before_the_workers_gives_the_run_folder_back(tmp_path, monkeypatch):
    from rlpost.config import load_config
    from rlpost.controller import loop
    from rlpost.controller.run_lock import LOCK
    from rlpost.data.dataset import DataError

    def unreadable(*args, **kwargs):
        raise DataError("t.jsonl: row 0: field 'prompt' is missing")

    monkeypatch.setattr(loop, "model_and_base", unreadable)
    with pytest.raises(DataError):
        loop.Controller(load_config(["+recipe=quickstart", f"run.dir={tmp_path}"]), log=lambda *_: None)
    assert (tmp_path / "config.yaml").is_file() and not (tmp_path / LOCK).exists()  # no stale lock


def test_a_stop_on_a_signal_is_named_by_the_signal_and_exits_128_plus_it():
    stopped = Stopped(signal.SIGINT)
    assert (str(stopped), stopped.exit_code) == ("SIGINT", 130)


def test_the_first_signal_is_noted_and_the_second_stops_at_once(capsys):
    """`_note` called as the handler would be, with no signal sent (the test process keeps its own).
    The first is answered at once, not when the step ends (the third catalogue's re-check, N6)."""
    from rlpost.controller.signals import StopSignals

    signals = StopSignals()
    signals.before_start = False  # the workers have started
    try:
        try:
            signals._note(signal.SIGTERM, None)
        except KeyboardInterrupt as e:  # (not let through: pytest would stop the session on it)
            pytest.fail(f"the first signal stopped at once: {e}")
        assert signals.signal == signal.SIGTERM
        assert capsys.readouterr().err == (
            "\nrlpost: SIGTERM: stopping after the step under way; send it again to stop at once\n"
        )
        with pytest.raises(KeyboardInterrupt, match="^second SIGINT: stopping at once$"):
            signals._note(signal.SIGINT, None)
    finally:
        signals.restore()


def test_a_signal_while_the_workers_start_stops_the_start_at_its_next_look(capsys):
    """The tenth catalogue's t57: the first signal waited for workers that Ray's memory monitor killed
    again and again (a start that never came). It is noted (raised in the handler, inside Ray's wait,
    it became a SystemError traceback), and the start's waits, which look each second, stop."""
    from rlpost.controller.signals import StopSignals

    stop = StopSignals()
    stop.before_start, stop.starting = False, True
    try:
        stop.check()  # no signal: nothing
        stop._note(signal.SIGINT, None)
        assert capsys.readouterr().err == (
            "\nrlpost: SIGINT while the workers started: stopping now (what started is shut down)\n"
        )
        with pytest.raises(Stopped) as stopped:
            stop.check()
        assert stopped.value.exit_code == 128 + signal.SIGINT
        stop.starting = False
        stop.check()  # started: the loop stops after its step
    finally:
        stop.restore()


@pytest.mark.parametrize("restarts", [0, 1])
def test_actors_dead_with_no_restart_left_end_the_run_naming_them_and_how_to_go_on(
    fake, tmp_path, restarts, monkeypatch
):
    """A killed trainer rank or node ended the command with Ray's traceback; now one message says
    what died, after which step, the newest complete checkpoint and the command that goes on."""
    fake.signal = False
    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_2" / "controller.pt").write_bytes(b"")
    # on the class for this test only: set plainly, they outlived it, and the restart test after it
    # failed (in the order mutmut's clean run chose)
    monkeypatch.setattr(fake, "run_dir", tmp_path)
    monkeypatch.setattr(
        fake, "run", lambda self, stop: (_ for _ in ()).throw(checkpoint_error_from_a_dead_actor().__cause__)
    )
    cfg = TrainConfig()
    cfg.trainer.max_restarts = restarts
    with pytest.raises(run_module.WorkersDied) as info:
        run_module.train(cfg, log=lambda *_: None)
    after = "after 1 restarts; " if restarts else ""
    assert str(info.value) == (
        f"trainer 0 died (RayActorError: The actor experienced an error before finishing this task.); the run stopped "
        f"{after}after step 3. Its newest complete checkpoint: {tmp_path / 'checkpoints' / 'step_2'}; to go on from "
        f"it, run the same command with trainer.resume=auto run.dir={tmp_path} (trainer.max_restarts=N restarts by "
        "itself)"
    )
    assert fake.calls.count(("shutdown",)) == restarts + 1


def test_actors_dead_in_a_run_without_checkpoints_are_not_told_to_resume(tmp_path):
    """The seventeenth catalogue's t71: with no checkpoint the message still said "to go on from it, run
    the same command with trainer.resume=auto", which starts the run again from step 0 in its folder."""
    from types import SimpleNamespace

    controller = SimpleNamespace(run_dir=tmp_path, step=2)
    said = str(run_module.workers_died(TrainConfig(), controller, ["trainer 0"], 0, RuntimeError("gone")))
    assert said == (
        "trainer 0 died (RuntimeError: gone); the run stopped after step 2. No checkpoint was written, so nothing to "
        "go on from: run it again (here with run.overwrite=true); trainer.save_every=N and trainer.max_restarts=N "
        "let a run go on after this"
    )


def test_a_dead_rollout_actor_of_a_run_with_episodes_names_the_environment(tmp_path):
    """The eleventh catalogue's t34: `os._exit` in `env.step` killed the rollout actor; the message
    advised a resume or restarts, which fail the same way, and did not name env.name."""
    from types import SimpleNamespace

    controller = SimpleNamespace(run_dir=tmp_path, step=2)
    episodes = TrainConfig()
    episodes.env.name = "my_envs.py:Maze"
    said = str(run_module.workers_died(episodes, controller, ["rollout 0"], 0, RuntimeError("gone")))
    assert said.endswith(
        "let a run go on after this. The rollout actors run env.name=my_envs.py:Maze's episodes: an "
        "episode step that ends its process (os._exit, a crash in native code) kills the actor the same way after "
        "every restart"
    )
    trainer = str(run_module.workers_died(episodes, controller, ["trainer 0"], 0, RuntimeError("gone")))
    plain = str(run_module.workers_died(TrainConfig(), controller, ["rollout 0"], 0, RuntimeError("gone")))
    assert trainer.endswith("let a run go on after this") and plain.endswith("let a run go on after this")


def test_a_hangup_stops_the_run_as_sigterm_does_unless_nohup_ignores_it():
    """SIGHUP (the terminal or ssh session closed) killed the run at once, with no checkpoint and
    the lock left behind (the fifth catalogue's s01); under `nohup` it stays ignored."""
    from rlpost.controller.signals import StopSignals

    before = signal.getsignal(signal.SIGHUP)
    try:
        # from the default, whatever this process inherited: run under `nohup` (as a mutation run in
        # the background was) the first half failed, and mutmut stopped at its clean run
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signals = StopSignals()
        assert signal.getsignal(signal.SIGHUP) == signals._note
        signals.restore()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signals = StopSignals()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN and signal.SIGHUP not in signals.previous
        signals.restore()
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_checkpoint_that_failed_with_every_actor_alive_is_said_as_itself(fake, monkeypatch):
    """The eleventh catalogue's t73: a full disk while the ranks wrote a checkpoint came through
    Ray's task error, and the run ended with "a Ray worker or node of the run died (CheckpointError
    ...)" and advice to restart; no worker had died."""
    fake.signal = False
    monkeypatch.setattr(FakeController, "dead_actors", lambda self: [])
    with pytest.raises(CheckpointError, match="^writing checkpoint step_3 failed$"):
        run_module.train(TrainConfig(), log=lambda *_: None)
    assert fake.calls == [("start", 0), ("shutdown",)]
