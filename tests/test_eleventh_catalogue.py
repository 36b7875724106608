"""Faults the eleventh bad-input catalogue found (tried by someone who did not write the code, on
4c0e953): each test fails on the code before its fix."""

import pytest

from rlpost.config import ConfigError
from tests.controller.test_run_dir import cfg_in, earlier_run


def test_overwrite_never_deletes_through_a_link_to_another_runs_checkpoints(tmp_path):
    """t75 (LOSS): `run.overwrite=true` in a run whose checkpoints/ links to another run's deleted
    that run's step_1..3 through the link, then failed with a raw NotADirectoryError."""
    from rlpost.controller.run_dir import claim_run_dir

    other, run = tmp_path / "other", tmp_path / "run"
    earlier_run(other)
    earlier_run(run)
    import shutil

    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(other / "checkpoints")
    with pytest.raises(ConfigError, match=r"^run.overwrite=true would delete through a link \(.*/run/checkpoints -> "):
        claim_run_dir(cfg_in(run, "run.overwrite=true"), log=lambda *_: None)
    assert (other / "checkpoints" / "step_2" / "controller.pt").exists()  # the other run's, untouched
    assert (run / "metrics.jsonl").exists()  # nothing of this run's deleted either: refused first


def test_a_signal_during_the_runs_report_lets_it_finish_and_shut_down(tmp_path, capsys):
    """t97 (HANG): `run_steps` put the previous handlers back before the report (summary.json,
    curves.png, the console's summary) and the shutdown: a SIGTERM then killed the process, with
    the lock left and Ray's agents orphaned. The handlers now stay until the caller's shutdown,
    and a signal after the last step only says so."""
    import os
    import signal

    from rlpost.controller.progress import run_steps
    from rlpost.controller.signals import StopSignals
    from tests.controller.test_progress import FakeController

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


@pytest.mark.parametrize("seeds, code", [("0,1", 128 + 15), ("0", 0)])
def test_a_sweep_whose_job_had_finished_when_the_signal_came_does_not_say_to_resume_it(
    tmp_path, monkeypatch, capsys, seeds, code
):
    """t98: the job ended normally as the signal reached it, and the sweep advised resuming a job
    that had trained all its steps."""
    import os
    import signal
    import subprocess

    from rlpost import cli

    class Finished:  # the job: ends well (exit 0) though it got the signal
        def __init__(self, command):
            pass

        def send_signal(self, signum):
            pass

        def wait(self):
            os.kill(os.getpid(), signal.SIGTERM)
            return 0

    monkeypatch.setattr(subprocess, "Popen", Finished)
    argv = ["train", "-m", "+recipe=quickstart", f"run.dir={tmp_path / 's'}", f"run.seed={seeds}"]
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert "sweep stopped by SIGTERM after job 0 ended" in err and "trainer.resume=auto" not in err
    assert ("jobs 1.. did not run" in err) == (code != 0)
