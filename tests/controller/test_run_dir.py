"""A run folder belongs to one run (`rlpost.controller.run_dir`): a second run is refused while
the first holds the folder's lock, a folder holding another run's steps is refused unless this
run resumes it or asks to overwrite it, and nothing is deleted unasked."""

import json
import os
import socket
import subprocess
import sys

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller.run_dir import LOCK, claim_run_dir, release_run_dir

pytestmark = pytest.mark.timeout(60)


def cfg_in(run_dir, *overrides):
    return load_config(["+recipe=quickstart", f"run.dir={run_dir}", *overrides])


def earlier_run(run_dir):
    """What a run that got to step 2 leaves: metrics, a checkpoint, a file of the user's."""
    (run_dir / "checkpoints" / "step_2").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
    (run_dir / "notes.txt").write_text("mine")


def test_a_new_folder_is_made_locked_and_released(tmp_path):
    run_dir = tmp_path / "a" / "run"
    assert claim_run_dir(cfg_in(run_dir), log=lambda *_: None) == run_dir
    assert json.loads((run_dir / LOCK).read_text())["pid"] == os.getpid()
    assert (run_dir / "config.yaml").is_file()
    claim_run_dir(cfg_in(run_dir), log=lambda *_: None)  # this process again (a restart after an actor died)
    release_run_dir(run_dir)
    assert not (run_dir / LOCK).exists()


def test_a_folder_with_another_runs_steps_is_refused_unless_resumed_or_overwritten(tmp_path):
    earlier_run(tmp_path)
    with pytest.raises(ConfigError) as info:
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    assert str(info.value) == (
        f"run.dir={str(tmp_path)!r} holds another run's steps (metrics.jsonl, checkpoints/): resume it with "
        "trainer.resume=auto, choose another run.dir, or set run.overwrite=true to delete that run's logs and "
        "checkpoints and start again"
    )
    assert (tmp_path / "checkpoints" / "step_2").is_dir() and len((tmp_path / "metrics.jsonl").read_text()) > 20
    assert not (tmp_path / LOCK).exists()  # a refused claim leaves no lock
    claim_run_dir(cfg_in(tmp_path, "trainer.resume=auto"), log=lambda *_: None)  # resuming it is fine
    release_run_dir(tmp_path)
    said = []
    claim_run_dir(cfg_in(tmp_path, "run.overwrite=true"), log=said.append)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "metrics.jsonl").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"  # not the run's: kept
    assert said and "run.overwrite=true: deleted the earlier run's" in said[0]
    release_run_dir(tmp_path)


def test_a_run_that_never_got_past_its_start_is_not_in_the_way(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "start/pass@1": 0.5}\n')
    claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    release_run_dir(tmp_path)


def test_a_live_runs_lock_refuses_a_second_run_and_a_dead_ones_is_taken_over(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "since": 0}))
        with pytest.raises(ConfigError, match=rf"is in use by another run \(pid {holder.pid} on host "):
            claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    finally:
        holder.kill()
        holder.wait()
    said = []
    claim_run_dir(cfg_in(tmp_path), log=said.append)  # its process is gone
    assert said == [f"{tmp_path / LOCK}: the run that held it (pid {holder.pid}) is gone; taking the folder over"]
    release_run_dir(tmp_path)


def test_a_lock_of_another_host_is_refused(tmp_path):
    (tmp_path / LOCK).write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": 0}))
    with pytest.raises(ConfigError, match=r"pid 1 on host elsewhere.*if that run is gone, delete .*run.lock"):
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)


def test_a_run_dir_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"run.dir='.*/f' is a file, not a folder; choose another run.dir"):
        claim_run_dir(cfg_in(tmp_path / "f"), log=lambda *_: None)


def test_a_users_own_config_yaml_is_not_replaced(tmp_path):
    """A project folder given as run.dir, with a config.yaml of the user's: refused, the file kept;
    a run's own config.yaml (an earlier run that never got past its start) is replaced."""
    mine = "# my project settings\nlr: 0.1\nnotes: do not lose me\n"
    (tmp_path / "config.yaml").write_text(mine)
    with pytest.raises(ConfigError) as info:
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    assert str(info.value) == (
        f"run.dir={str(tmp_path)!r} holds a config.yaml that no rlpost run wrote, which a run would replace with its "
        "own: choose another run.dir (a new or empty folder)"
    )
    assert (tmp_path / "config.yaml").read_text() == mine and not (tmp_path / LOCK).exists()
    for text in ("[1, 2]\n", "run: [unclosed\n", ""):  # a list, not YAML, empty
        (tmp_path / "config.yaml").write_text(text)
        with pytest.raises(ConfigError, match="holds a config.yaml that no rlpost run wrote"):
            claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    claim_run_dir(cfg_in(tmp_path / "earlier"), log=lambda *_: None)  # a run's own, left by a start that failed
    release_run_dir(tmp_path / "earlier")
    claim_run_dir(cfg_in(tmp_path / "earlier", "run.seed=7"), log=lambda *_: None)
    assert "seed: 7" in (tmp_path / "earlier" / "config.yaml").read_text()
    release_run_dir(tmp_path / "earlier")
