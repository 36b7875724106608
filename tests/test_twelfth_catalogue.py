"""Faults the twelfth bad-input catalogue found (tried by someone who did not write the code, on
87f04e7): each test fails on the code before its fix."""

import json

import pytest

from rlpost.config import ConfigError
from tests.run_dirs import cfg_in, earlier_run


def test_overwrite_never_deletes_through_a_checkpoint_linked_to_another_runs(tmp_path):
    """t81: `run.overwrite=true` in a run whose checkpoints/step_3 links to another run's checkpoint
    ended in a raw `OSError: Cannot call rmtree on a symbolic link` (t75 had fixed a linked
    checkpoints/ folder, not a linked entry in it)."""
    from rlpost.controller.run_dir import claim_run_dir

    other, run = tmp_path / "other", tmp_path / "run"
    earlier_run(other)
    earlier_run(run)
    (run / "checkpoints" / "step_3").symlink_to(other / "checkpoints" / "step_2")
    with pytest.raises(
        ConfigError, match=r"^run.overwrite=true would delete through a link \(.*/run/checkpoints/step_3 -> "
    ):
        claim_run_dir(cfg_in(run, "run.overwrite=true"), log=lambda *_: None)
    assert (other / "checkpoints" / "step_2" / "controller.pt").exists()
    assert (run / "checkpoints" / "step_2" / "controller.pt").exists()  # refused before anything went


def test_a_lock_whose_start_is_not_a_time_is_refused_by_name(tmp_path):
    """t18: a `run.lock` written by hand with `"since": "yesterday"` ended in a raw TypeError."""
    from rlpost.controller.run_dir import LOCK, claim_run_dir

    (tmp_path / LOCK).write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": "yesterday"}))
    with pytest.raises(ConfigError, match=r"in use by another run \(pid 1 on host elsewhere, since 'yesterday'\); "):
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)


def test_a_lora_rank_above_the_models_hidden_size_is_refused_before_the_actors(tmp_path):
    """t14: `model.lora.rank=100000` started the actors and ran out of memory in Ray after 144 s."""
    from rlpost.config import load_config
    from rlpost.controller.setup import check_lora_targets
    from tests.helpers import save_tiny_model

    save_tiny_model(tmp_path / "m", hidden=32, intermediate=64)
    for targets in ("[all-linear]", "[q_proj]"):
        cfg = load_config(["+recipe=quickstart", "model.lora.rank=33", f"model.lora.target_modules={targets}"])
        with pytest.raises(ConfigError, match=r"^model.lora.rank=33 is above .*/m's hidden size \(32\): the adapters "):
            check_lora_targets(cfg, str(tmp_path / "m"))
    check_lora_targets(load_config(["+recipe=quickstart", "model.lora.rank=32"]), str(tmp_path / "m"))


def test_a_sigint_while_the_command_imports_is_one_line(monkeypatch, capsys):
    """t74: Ctrl-C 3.5 s into `rlpost train`, while it imported its libraries, printed a raw
    KeyboardInterrupt traceback from triton's import."""
    from rlpost import cli

    def importing(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_train", importing)
    assert cli.main(["train", "+recipe=quickstart"]) == 130
    assert capsys.readouterr().err == "\nrlpost train: interrupted (SIGINT) as it started: nothing was trained\n"


def test_a_metrics_file_that_cannot_be_written_for_want_of_permission_is_not_a_full_disk(tmp_path, monkeypatch):
    """t100: `chattr +i metrics.jsonl` mid-run: "cannot write ... (Operation not permitted): free space there"."""
    import errno
    import os

    from rlpost.metrics.trackers import JsonlTracker, TrackerError

    tracker = JsonlTracker(tmp_path)

    def refused(fd, data):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "write", refused)
    with pytest.raises(TrackerError, match=r"\(Operation not permitted\): make it writable \(or choose another run"):
        tracker.log({"reward/mean": 0.5}, 1)
    monkeypatch.undo()
    tracker.close()


def test_plot_draws_the_picture_its_name_asks_for_or_refuses_the_name(tmp_path):
    """t59: `rlpost plot RUN --out x.svg` (or `.jpgx`) wrote PNG bytes under that name, without a word
    (since bd4ba2d drew beside the picture and renamed it, always as PNG)."""
    from rlpost.metrics.plot import plot_json

    bench = tmp_path / "bench.json"
    bench.write_text('{"val_accuracy": [[0, 0.1], [1, 0.4], [2, 0.5]]}')
    out, _ = plot_json(bench, tmp_path / "b.svg")
    assert out.read_bytes().lstrip().startswith(b"<?xml") and b"<title>rlpost</title>" in out.read_bytes()
    plot_json(bench, tmp_path / "b.svg")  # its own picture: drawn again
    assert plot_json(bench, tmp_path / "b.png")[0].read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match=r"^--out .*/b.jpgx: pictures are drawn as .png or .svg; give a name"):
        plot_json(bench, tmp_path / "b.jpgx")
    assert not (tmp_path / "b.jpgx").exists()


def test_a_lock_that_cannot_be_written_is_not_left_empty(tmp_path, monkeypatch):
    """t16/t159: a run started in a run.dir on a full disk was refused clearly but left a 0-byte
    run.lock; once space was freed the same command was refused as "in use by another run (pid None"."""
    import errno

    from rlpost.controller import run_dir
    from rlpost.controller.run_dir import LOCK, claim_run_dir

    def full(obj, f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_dir.json, "dump", full)
    with pytest.raises((OSError, ConfigError)):
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    assert not (tmp_path / LOCK).exists()
