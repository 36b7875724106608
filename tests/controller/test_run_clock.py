"""The run's clock: the start-up's phases (`Workers.lap`, `progress.start_line`) and the wall time a
resumed run goes on from (`progress.run_time_at`)."""

import time

from rlpost.controller.progress import start_line
from rlpost.controller.workers import Workers


def test_the_start_up_line_names_each_phase_and_their_sum():
    phases = {"time/start_prepare_s": 1.3, "time/start_ray_s": 20.0, "time/start_engines_s": 30.5}
    assert start_line(phases) == "start-up 51.8 s: prepare 1.3 s, ray 20.0 s, engines 30.5 s"


def test_the_workers_laps_are_the_seconds_between_them(monkeypatch):
    clock = iter([12.5, 20.0])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    w = Workers(lapped=10.0)  # made at 10.0
    w.lap("prepare")
    w.lap("ray")
    assert w.start_s == {"time/start_prepare_s": 2.5, "time/start_ray_s": 7.5}


def test_a_resumed_runs_wall_time_goes_on_from_the_resumed_steps(tmp_path):
    from rlpost.controller.progress import run_time_at

    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 0}\n{"step": 1, "time/run_s": 30.0}\n{"step": 2, "time/run_s": 50.0}\n{"step": 3}\n'
    )
    assert [run_time_at(tmp_path, s) for s in (1, 2, 3, 4)] == [30.0, 50.0, 0.0, 0.0]  # 3: an older run's row
    assert run_time_at(tmp_path / "none", 2) == 0.0
