"""benchmarks/gpu_queue.py: the job list it reads and the command each job gets."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def load_queue():
    spec = importlib.util.spec_from_file_location("gpu_queue", REPO / "benchmarks" / "gpu_queue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jobs_read_with_shared_overrides_from_the_environment(tmp_path, monkeypatch):
    queue = load_queue()
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("# comment\na 1 x=1 $SHARED  # trailing\n\nb 4 y=2\n")
    monkeypatch.setenv("SHARED", "p=3 q=4")
    assert queue.read_jobs(jobs) == [("a", 1, ["x=1", "p=3", "q=4"]), ("b", 4, ["y=2"])]


def test_a_variable_not_set_names_the_line(tmp_path, monkeypatch):
    queue = load_queue()
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("a 1 x=1\nb 2 $NOT_SET_ANYWHERE\n")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(SystemExit, match="line 2: set the variable"):
        queue.read_jobs(jobs)
    jobs.write_text("a one x=1\n")
    with pytest.raises(SystemExit, match="line 1: want `NAME GPUS"):
        queue.read_jobs(jobs)


def test_a_job_waits_for_the_job_it_names_and_resumes_its_own_checkpoints(tmp_path):
    queue = load_queue()
    assert queue.command(tmp_path, "b", ["trainer.resume=@a/checkpoints/step_6"], []) is None
    (tmp_path / "a.done").touch()
    cmd = queue.command(tmp_path, "b", ["trainer.resume=@a/checkpoints/step_6"], ["c=1"])
    assert cmd[-3:] == [f"trainer.resume={tmp_path}/a/checkpoints/step_6", "c=1", f"run.dir={tmp_path / 'b'}"]
    (tmp_path / "b" / "checkpoints" / "step_2").mkdir(parents=True)
    assert "trainer.resume=auto" in queue.command(tmp_path, "b", [], [])
