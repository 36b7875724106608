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
    from rlpost.controller.run_dir import claim_run_dir
    from rlpost.controller.run_lock import LOCK

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

    from rlpost.controller import run_lock
    from rlpost.controller.run_dir import claim_run_dir
    from rlpost.controller.run_lock import LOCK

    def full(obj, f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_lock.json, "dump", full)
    with pytest.raises((OSError, ConfigError)):
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    assert not (tmp_path / LOCK).exists()


@pytest.mark.parametrize("saved", [False, True])
def test_the_advice_after_a_signal_goes_on_from_a_checkpoint_only_where_there_is_one(tmp_path, saved):
    """t137/t190: "stopped by SIGTERM after step 26 (no checkpoint); to go on, run the same command
    with trainer.resume=auto" where nothing was saved; following it started afresh and replaced the
    26 logged steps."""
    from types import SimpleNamespace

    from rlpost.controller import checkpoint
    from rlpost.controller.loop import Controller
    from rlpost.controller.signals import Stopped

    if saved:
        checkpoint.save(tmp_path, 26, {"step": 26}, [], keep=0)
    said = []
    c = SimpleNamespace(cfg=cfg_in(tmp_path, "trainer.save_on_signal=false"), run_dir=tmp_path, step=26)
    c.report, c.log = lambda: None, said.append
    with pytest.raises(Stopped):
        Controller.stop_on(c, 15)
    where = f"checkpoint {tmp_path / 'checkpoints' / 'step_26'}" if saved else "no checkpoint"
    advice = (
        f"to go on, run the same command with trainer.resume=auto run.dir={tmp_path}"
        if saved
        else "nothing to go on from: run it again (here with run.overwrite=true, which replaces its logs)"
    )
    assert said == [f"stopped by SIGTERM after step 26 ({where}); {advice}"]


def test_a_resume_says_the_settings_its_config_file_holds_that_the_run_does_not_take(tmp_path):
    """t101: `config.yaml` edited (lr 0.0003 -> 0.5), then `trainer.resume=auto`: the run took the
    command line's lr and wrote config.yaml back without a word."""
    from rlpost.config import to_yaml
    from rlpost.controller.run_dir import claim_run_dir, release_run_dir

    def resumed() -> list[str]:
        said = []
        release_run_dir(claim_run_dir(cfg_in(tmp_path, "trainer.resume=auto"), log=said.append))
        return [line for line in said if "config.yaml held other settings" in line]

    earlier_run(tmp_path)
    assert resumed() == []  # the same settings: nothing to say
    lr = cfg_in(tmp_path).trainer.optim.lr
    (tmp_path / "config.yaml").write_text(to_yaml(cfg_in(tmp_path, "trainer.optim.lr=0.5")))
    assert resumed() == [
        f"{tmp_path / 'config.yaml'} held other settings than this resume's: trainer.optim.lr=0.5 there, {lr!r} here. "
        "A run takes its settings from the command line and its recipe, never from config.yaml, which now records "
        "this run's: to change a setting, give it on the command line"
    ]
    assert f"lr: {lr}" in (tmp_path / "config.yaml").read_text()  # the file records the run's settings
    assert resumed() == []


def test_a_reward_that_starts_processes_is_told_why_it_cannot(tmp_path):
    """t114: a reward function using `multiprocessing.Pool` failed on every sample with "AssertionError:
    daemonic processes are not allowed to have children", and nothing said what to do."""
    from rlpost.rewards.base import RewardInput
    from rlpost.rewards.pool import RewardPool

    (tmp_path / "r.py").write_text(
        "import multiprocessing\n\ndef reward(sample):\n"
        "    with multiprocessing.Pool(2) as pool:\n        return float(sum(pool.map(abs, [1])))\n"
    )
    pool = RewardPool(f"{tmp_path / 'r.py'}:reward", {}, 1, timeout_s=20, memory_mb=0, error_score=0.0)
    try:
        out = pool.score([RewardInput("1+2=", "3", "3", "x")])
    finally:
        pool.close()
    last = out.first_error.splitlines()[-1]
    assert last.startswith("AssertionError: daemonic processes are not allowed to have children (the reward runs in")
    assert "score in threads, or let reward.num_workers set how many processes score at once)" in last


def test_a_default_data_source_that_no_row_reads_is_refused(tmp_path):
    """t169: `data.default_data_source=nosuch` where every row has its own data_source trained on
    without a word (it names no reward either)."""
    from rlpost.config import load_config
    from rlpost.controller.setup import load_data
    from rlpost.tiny.model import build_char_tokenizer

    rows = [{"prompt": "1+2=", "ground_truth": "3", "data_source": "arithmetic"}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = [f"data.train_files=[{tmp_path / 't.jsonl'}]", f"data.val_files=[{tmp_path / 't.jsonl'}]", "data.task="]
    files.append("data.train_batch_size=1")
    with pytest.raises(ConfigError, match=r"^data.default_data_source='nosuch' is read only for rows without a "):
        load_data(
            load_config(["+recipe=quickstart", *files, "data.default_data_source=nosuch"]), build_char_tokenizer()
        )
    rows[0]["data_source"] = ""
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    load_data(
        load_config(["+recipe=quickstart", *files, "data.default_data_source=arithmetic"]), build_char_tokenizer()
    )


def test_train_without_a_recipe_is_told_to_start_from_one(capsys):
    """t88: `rlpost train` alone was refused for the defaults' own contradiction (272 positions
    against the tiny model's 128), with nothing saying to pick a recipe."""
    from rlpost.cli import checked_config

    assert checked_config(["trainer.total_steps=1"]) is None
    err = capsys.readouterr().err
    assert err.startswith("rlpost: config error: ") and err.rstrip().endswith(
        "; no recipe was given: start from one, e.g. +recipe=quickstart (rlpost train --help lists them)"
    )
    assert checked_config(["+recipe=quickstart", "model.tiny.max_position=19"]) is None
    assert "no recipe was given" not in capsys.readouterr().err


def test_a_sigterm_during_an_export_says_so_and_leaves_no_half_written_folder(tmp_path, monkeypatch, capsys):
    """t99: a SIGTERM 1.7 s into `rlpost export` ended it with exit 143, no line, and its
    `.rlpost-export` claim (and what it had written) left in --out."""
    import os
    import signal

    from rlpost import cli
    from rlpost.controller import export as exporting

    def killed_while_writing(cfg, folder, out_dir, dtype, log):
        (out_dir / "model.safetensors").write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGTERM)  # the handler raises at once, in this thread

    monkeypatch.setattr(exporting, "write_export", killed_while_writing)
    monkeypatch.setattr(exporting, "select", lambda run_dir, step, log: run_dir / "checkpoints" / "step_2")
    earlier_run(tmp_path / "run")
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 143
    err = capsys.readouterr().err
    assert err == f"rlpost export: stopped by SIGTERM; {tmp_path / 'out'} is left as it was before the export\n"
    assert not (tmp_path / "out").exists() and signal.getsignal(signal.SIGTERM) is before


def test_a_second_signal_that_lands_in_a_finalizer_is_sent_again_not_dropped(monkeypatch):
    """t01/t186: the second SIGTERM, handled while a garbage-collected object's `__del__` ran, was
    raised inside it and dropped ("Exception ignored in: <function Group.__del__ ...>"); the run went
    on to the end of its step."""
    import signal
    import sys

    from rlpost.controller import signals as module

    sent = []

    class Timer:  # the handler's re-sending, taken here instead of sent to the test process
        def __init__(self, delay, fn, args):
            sent.append((delay, fn, args))

        def start(self):
            pass

    monkeypatch.setattr(module.threading, "Timer", Timer)
    stop = module.StopSignals()
    stop.before_start = False
    try:
        stop._note(signal.SIGTERM, None)

        def __del__():  # a finalizer's frame, as the handler finds it when it runs there
            stop._note(signal.SIGTERM, sys._getframe())

        __del__()
        assert sent == [(0.05, module.os.kill, (module.os.getpid(), signal.SIGTERM))]
        with pytest.raises(KeyboardInterrupt, match="^second SIGTERM: stopping at once$"):  # outside a __del__
            stop._note(signal.SIGTERM, sys._getframe())
    finally:
        stop.restore()


def test_a_second_signal_while_the_run_shuts_down_lets_the_shutdown_finish(capsys):
    """t187: a second SIGTERM 1 s after the first reached the run in its shutdown: it died at once,
    exit 143 and no line, and Ray's dashboard and runtime-env agents outlived it by 90 s."""
    import signal

    from rlpost.controller.signals import StopSignals

    stop = StopSignals()
    stop.before_start = False
    try:
        stop._note(signal.SIGTERM, None)
        capsys.readouterr()
        stop.finishing = True  # as train() sets it around each controller's shutdown
        stop._note(signal.SIGTERM, None)
        assert capsys.readouterr().err == "\nrlpost: SIGTERM as the run ends: finishing its summary and shutdown\n"
        assert stop.signal == signal.SIGTERM
    finally:
        stop.restore()


def test_a_full_temporary_folder_is_refused_before_ray_starts(tmp_path, monkeypatch):
    """t158: TMPDIR on a full tmpfs (8 KiB free): after 40 s a 39-line raw traceback from ray.init
    ("The current node timed out during startup"), naming neither the disk nor TMPDIR."""
    import shutil
    import tempfile
    from collections import namedtuple

    from rlpost.controller.ray_checks import check_ray_can_start

    usage = namedtuple("usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(
        shutil, "disk_usage", lambda p: usage(12 << 20, (12 << 20) - 8192, 8192) if str(p) == str(tmp_path) else real(p)
    )
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    with pytest.raises(
        ConfigError, match=rf"^the temporary folder '{tmp_path}' \(TMPDIR, or RAY_TMPDIR\) has 0.0 MiB free"
    ):
        check_ray_can_start()
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, 0, (64 << 20) + 1))
    monkeypatch.setenv("TMPDIR", "/tmp")  # (tmp_path is too long for Ray's sockets: a refusal of its own)
    check_ray_can_start()


def test_resume_auto_passes_over_a_checkpoint_whose_files_the_actors_cannot_read(tmp_path):
    """The recheck of t87: `.distcp` bytes damaged at the same size were named, but `trainer.resume=auto`
    did not go on from the step before, as the docs say it does."""
    import ray

    from rlpost.controller import checkpoint

    older = checkpoint.save(tmp_path, 2, {"step": 2}, [], keep=0)
    newest = checkpoint.save(tmp_path, 3, {"step": 3}, [], keep=0)
    unreadable = "its trainer state could not be read (CheckpointException: ...): a file of it may be damaged"

    class Trainer:  # the actors: the files of the checkpoints in `damaged` cannot be read
        role = "trainer"

        def __init__(self, *damaged):
            self.damaged, self.loaded = [str(d) for d in damaged], []

        def call(self, method, folder):
            self.loaded.append(folder)
            if folder in self.damaged:
                raise ray.exceptions.RayTaskError("load", "tb", ValueError(unreadable))

    said, trainer = [], Trainer(newest)
    assert checkpoint.load_intact(newest, [trainer], auto=True, log=said.append) == (older, {"step": 2})
    assert trainer.loaded == [str(newest), str(older)]
    assert said == [
        f"trainer could not load checkpoint {newest}: {unreadable}\n"
        f"trainer.resume=auto: going on from the checkpoint before it, {older}"
    ]
    with pytest.raises(checkpoint.CheckpointError, match="could not be read"):  # one named by its path: refused
        checkpoint.load_intact(newest, [Trainer(newest)], auto=False)
    with pytest.raises(checkpoint.CheckpointError, match=f"checkpoint {older}: its trainer state could not be read"):
        checkpoint.load_intact(newest, [Trainer(newest, older)], auto=True, log=lambda *_: None)  # none left
