"""What a run folder's claim says and does where the mutation run of `rlpost.controller.run_dir`
(benchmarks/mutation/mutation_run_dir.json, on 48b05b8) found nothing checking it: the refusals
in full (they name the folder, the file and what to do), a live holder left running, the
config.yaml a run may replace, blank and long lines of a run's logs, what a resume says of
its folder's settings, and what run.overwrite=true deletes."""

import errno
import json
import os
import socket
import subprocess
import sys
from datetime import datetime

import pytest

from rlpost.config import ConfigError, load_config, to_yaml
from rlpost.controller import checkpoint
from rlpost.controller.run_dir import HEADER, claim_run_dir
from rlpost.controller.run_lock import LOCK, keep_lock, release_run_dir
from tests.run_dirs import cfg_in, earlier_run, run_config

pytestmark = pytest.mark.timeout(60)
ANOTHER = "another run.dir"


def refusal(cfg):
    with pytest.raises(ConfigError) as info:
        claim_run_dir(cfg, log=lambda *_: None)
    return str(info.value)


def claimed(cfg):
    """What the claim of `cfg` said; the folder released again."""
    said = []
    release_run_dir(claim_run_dir(cfg, log=said.append))
    return said


HOLDER = """
import signal, sys
signal.signal(signal.SIGHUP, lambda *_: sys.exit(3))  # any signal it is sent ends it with another status
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_live_holder_of_this_host_is_only_checked_never_signalled(tmp_path):
    """Survivor _alive 6 (os.kill(pid, 1): a SIGHUP to the run that holds the folder)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "ready\n"
        (tmp_path / LOCK).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "since": 0}))
        assert f"is in use by another run (pid {holder.pid} on host " in refusal(cfg_in(tmp_path))
    finally:
        holder.communicate()  # the run ends when its input does
    assert holder.returncode == 0


def test_a_lock_with_no_start_time_is_refused_naming_its_holder_and_the_lock(tmp_path):
    """Survivors _take_lock 50, 52, 55: a lock without its "since" (written by hand, or half written)."""
    epoch = datetime.fromtimestamp(0).strftime("%Y-%m-%d %H:%M:%S")
    (tmp_path / LOCK).write_text(json.dumps({"pid": 4242, "host": "elsewhere"}))
    assert refusal(cfg_in(tmp_path)) == (
        f"run.dir={str(tmp_path)!r} is in use by another run (pid 4242 on host elsewhere, since {epoch}); "
        f"wait for it to end or choose {ANOTHER} (if that run is gone, delete {tmp_path / LOCK})"
    )


def test_a_dead_lock_that_keeps_coming_back_is_taken_over_twice_then_refused_by_folder(tmp_path, monkeypatch):
    """Survivors _take_lock 2 (a third try) and 77 (the message's run.dir)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = json.dumps({"pid": gone.pid, "host": socket.gethostname(), "since": 0})
    (tmp_path / LOCK).write_text(stale)
    real_open = os.open

    def comes_back(path, flags, *args):  # another claimant, unguarded, between each unlink and create
        if str(path).endswith(LOCK) and flags & os.O_EXCL:
            (tmp_path / LOCK).write_text(stale)
            raise FileExistsError(path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", comes_back)
    said = []
    with pytest.raises(ConfigError) as info:
        claim_run_dir(cfg_in(tmp_path), log=said.append)
    assert said == [f"{tmp_path / LOCK}: the run that held it (pid {gone.pid}) is gone; taking the folder over"] * 2
    assert str(info.value) == (
        f"run.dir={str(tmp_path)!r}: {tmp_path / LOCK} came back each time it was taken over (another run claiming "
        f"the folder at the same time?); try again, or choose {ANOTHER}"
    )


def test_a_full_disk_as_the_lock_is_written_is_said_as_one_even_if_the_lock_went_meanwhile(tmp_path, monkeypatch):
    """Survivors _take_lock 74, 75 (unlink(missing_ok=False): the lock, removed by hand as the run
    started, turned the full disk into 'No such file or directory')."""

    def full_disk(obj, f):
        (tmp_path / LOCK).unlink()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("rlpost.controller.run_dir.json.dump", full_disk)
    assert refusal(cfg_in(tmp_path)) == (
        f"run.dir={str(tmp_path)!r}: cannot write there (No space left on device); choose {ANOTHER}"
    )
    assert not (tmp_path / LOCK).exists()


def test_a_lock_taken_by_another_run_while_this_one_trains_names_that_runs_host(tmp_path):
    """Survivors keep_lock 18, 19, 20."""
    claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    (tmp_path / LOCK).write_text(json.dumps({"pid": 4242, "host": "elsewhere", "since": 0}))
    with pytest.raises(checkpoint.CheckpointError) as info:
        keep_lock(tmp_path, 5, log=lambda *_: None)
    assert str(info.value) == (
        f"{tmp_path / LOCK} was taken by another run (pid 4242 on host elsewhere) while this one trained, after step "
        "5 (its lock had been deleted): stopped here so that the two do not write into one folder; the other may "
        f"have deleted this run's files (run.overwrite); go on in {ANOTHER}"
    )


def test_a_resume_of_another_folders_checkpoint_over_a_third_run_is_refused_naming_both(tmp_path):
    """Survivor another_run 3 (the folder and its steps dropped from the message)."""
    other, here = tmp_path / "other", tmp_path / "here"
    earlier_run(other)
    earlier_run(here)
    cfg = cfg_in(here, "trainer.total_steps=5")
    cfg.trainer.resume = str(other / "checkpoints" / "step_2")
    assert refusal(cfg) == (
        f"run.dir={str(here)!r} holds another run's steps (metrics.jsonl, checkpoints/), and trainer.resume="
        f"{cfg.trainer.resume} is a checkpoint of {other}: its steps would be written into that run's logs: resume it "
        f"with trainer.resume=auto, choose {ANOTHER}, or set run.overwrite=true to delete that run's logs and "
        "checkpoints and start again"
    )


def test_a_resume_of_a_checkpoint_of_its_own_folder_goes_on_there(tmp_path):
    """Survivor claim_run_dir 50 (its own checkpoint taken for another folder's: refused)."""
    run_config(tmp_path)
    checkpoint.save(tmp_path, 3, {"step": 3}, [], keep=0)
    rows = "".join(f'{{"step": {step}}}\n' for step in range(4))
    (tmp_path / "metrics.jsonl").write_text(rows)
    claimed(cfg_in(tmp_path, f"trainer.resume={tmp_path / 'checkpoints' / 'step_3'}", "trainer.total_steps=5"))
    assert (tmp_path / "metrics.jsonl").read_text() == rows and (tmp_path / "checkpoints" / "step_3").is_dir()


def test_a_config_yaml_is_replaced_only_when_a_run_wrote_it(tmp_path):
    """Survivors check_config_file 12 (no comment: any sections passed), 13 (a comment: passed with
    every main section), 25 (a run's of only the main sections, before the header, refused)."""
    full = to_yaml(load_config(["+recipe=quickstart"]))
    for users in ("run: {seed: 3}\ntrainer: {total_steps: 50}\n", "# my tuned copy\n" + full):
        (tmp_path / "config.yaml").write_text(users)
        assert "holds a config.yaml that no rlpost run wrote" in refusal(cfg_in(tmp_path))
        assert (tmp_path / "config.yaml").read_text() == users
    import yaml

    main = {k: v for k, v in yaml.safe_load(full).items() if k in ("run", "model", "data", "trainer", "algo")}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(main))  # an older run's, with only those sections
    claimed(cfg_in(tmp_path))
    assert (tmp_path / "config.yaml").read_text().startswith(HEADER)


def test_run_files_of_another_kind_or_without_a_config_are_refused_naming_each(tmp_path):
    """Survivors check_run_files 21, 23 and 38 (the messages' folder and lists)."""
    (tmp_path / "odd" / "metrics.jsonl").mkdir(parents=True)
    (tmp_path / "odd" / "checkpoints").write_text("x")
    assert refusal(cfg_in(tmp_path / "odd")) == (
        f"run.dir={str(tmp_path / 'odd')!r} holds metrics.jsonl, checkpoints of another kind than a run writes there "
        "(a folder where a run writes a file, or a file where it writes its checkpoints/ folder): move it, or "
        f"choose {ANOTHER}"
    )
    (tmp_path / "mine").mkdir()
    for name in ("summary.json", "curves.png"):
        (tmp_path / "mine" / name).write_text("x")
    assert refusal(cfg_in(tmp_path / "mine")) == (
        f"run.dir={str(tmp_path / 'mine')!r} holds summary.json, curves.png that no rlpost run wrote (it has no "
        f"config.yaml), which a run would replace: choose {ANOTHER} (a new or empty folder), or move them"
    )


def test_a_line_that_is_no_row_is_named_in_samples_too_and_quoted_to_60_characters(tmp_path):
    """Survivors check_run_files 43, 44 (samples.jsonl's lines not checked) and 72 (61 characters)."""
    run_config(tmp_path)
    (tmp_path / "samples.jsonl").write_text('{"step": 0}\nmy notes on step 0\n')
    for overrides in ((), ("trainer.resume=auto",)):
        assert refusal(cfg_in(tmp_path, *overrides)) == (
            f"run.dir={str(tmp_path)!r}: samples.jsonl line 2 is not a row rlpost wrote ('my notes on step 0'); a run "
            "keeps or drops that file's rows by step: remove the line (edited by hand?) or move the file"
        )
    (tmp_path / "samples.jsonl").unlink()
    (tmp_path / "metrics.jsonl").write_text("0123456789" * 8 + "\n")
    assert f"metrics.jsonl line 1 is not a row rlpost wrote ('{'0123456789' * 6}'); " in refusal(cfg_in(tmp_path))


def test_blank_lines_in_a_runs_logs_are_not_in_the_way(tmp_path):
    """Survivors check_run_files 60, 62, 63 (a blank line taken for a row no run wrote)."""
    run_config(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n\n   \n')
    (tmp_path / "samples.jsonl").write_text('\n{"step": 0, "response": "4"}\n')
    assert claimed(cfg_in(tmp_path)) == []


def test_a_runs_rows_with_bytes_that_are_not_utf8_are_its_steps_not_a_crash(tmp_path):
    """Survivors holds_a_run 18, 19, 20 (read strictly: UnicodeDecodeError, LookupError)."""
    run_config(tmp_path)
    rows = b'{"step": 0}\n{"step": 1, "response": "caf\xe9"}\n'  # an edit saved as latin-1
    (tmp_path / "metrics.jsonl").write_bytes(rows)
    assert refusal(cfg_in(tmp_path)).startswith(f"run.dir={str(tmp_path)!r} holds another run's steps (metrics.jsonl")
    assert (tmp_path / "metrics.jsonl").read_bytes() == rows


def test_a_sweeps_folder_is_refused_by_its_name(tmp_path):
    """Survivor claim_run_dir 45."""
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    assert refusal(cfg_in(tmp_path)) == (
        f"run.dir={str(tmp_path)!r} is a sweep's folder (multirun.yaml): go on with the sweep (its `rlpost train -m "
        "...` command with trainer.resume=auto), one of its runs (run.dir=<it>/0), or another run.dir"
    )


SAVED = [  # (setting, in the folder's config.yaml, this resume's), in the order a run's config lists them
    ("trainer.val_every", 5, 10),
    ("trainer.keep_checkpoints", 3, 2),
    ("trainer.max_restarts", 1, 0),
    ("trainer.optim.lr", 0.001, 0.0003),
    ("trainer.optim.weight_decay", 0.1, 0.0),
    ("trainer.optim.eps", 1e-06, 1e-08),
    ("trainer.optim.grad_clip", 0.5, 1.0),
    ("trainer.optim.warmup_steps", 5, 10),
    ("trainer.optim.min_lr_ratio", 0.1, 0.0),
]


@pytest.mark.parametrize("edited", [1, 8, 9])
def test_a_resume_names_up_to_8_settings_its_folders_config_yaml_held_otherwise_and_counts_the_rest(tmp_path, edited):
    """Survivors say_edited_config 38 (the separator), 39 (9 named), 40, 42, 43 (the count of the
    rest), 44 (`(and 0 more)` after 8), 45 (none counted after 9)."""
    (tmp_path / "config.yaml").write_text(to_yaml(cfg_in(tmp_path, *(f"{k}={v}" for k, v, _ in SAVED[:edited]))))
    named = "; ".join(f"{k}={there!r} there, {here!r} here" for k, there, here in SAVED[: min(edited, 8)])
    more = " (and 1 more)" if edited == 9 else ""
    assert claimed(cfg_in(tmp_path, "trainer.resume=auto")) == [
        f"{tmp_path / 'config.yaml'} held other settings than this resume's: {named}{more}. A run takes its settings "
        "from the command line and its recipe, never from config.yaml, which now records this run's: to change a "
        "setting, give it on the command line"
    ]


def test_a_new_run_or_a_resume_is_not_told_of_settings_that_are_not_the_runs_own(tmp_path):
    """Survivors say_edited_config 1, 3, 4 (a new run, trainer.resume=none, told of the settings of
    the config.yaml it replaces) and 29-32 (run.overwrite and the folder's own old run.dir, after a
    move, named as edits)."""
    run_dir = tmp_path / "moved"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(to_yaml(cfg_in(tmp_path / "before", "run.seed=5")))
    assert claimed(cfg_in(run_dir)) == []  # a new run here (run.seed=0): the file is replaced, nothing to say
    # started with run.overwrite=true over an older run, in the folder's former place; now resumed
    (run_dir / "config.yaml").write_text(to_yaml(cfg_in(tmp_path / "before", "run.seed=5", "run.overwrite=true")))
    said = claimed(cfg_in(run_dir, "run.seed=5", "trainer.resume=auto"))
    assert not [line for line in said if "held other settings" in line]


def test_a_resume_that_adds_an_entry_to_a_dict_setting_goes_on(tmp_path):
    """Survivors say_edited_config 19, 21 (a key the folder's config.yaml does not have: KeyError)."""
    run_config(tmp_path)
    claimed(cfg_in(tmp_path, "trainer.resume=auto", "+reward.kwargs.method=flexible"))
    assert "method: flexible" in (tmp_path / "config.yaml").read_text()


def test_an_edit_of_config_yaml_that_adds_a_dict_entry_is_said_like_any_other(tmp_path):
    """Found writing these tests (fixed): say_edited_config compared only the keys of this run's config,
    so `reward.kwargs: {method: flexible}` added to config.yaml by hand (the twelfth catalogue's t101:
    an edit taken for a setting) was rewritten without a word."""
    (tmp_path / "config.yaml").write_text(to_yaml(cfg_in(tmp_path, "+reward.kwargs.method=flexible")))
    said = [line for line in claimed(cfg_in(tmp_path, "trainer.resume=auto")) if "held other settings" in line]
    assert said == [
        f"{tmp_path / 'config.yaml'} held other settings than this resume's: reward.kwargs.method='flexible' "
        "there, (not set) here. A run takes its settings from the command line and its recipe, never from "
        "config.yaml, which now records this run's: to change a setting, give it on the command line"
    ]


def test_a_resume_with_its_metrics_gone_says_so_once_and_prints_nothing_of_a_damaged_checkpoint(tmp_path, capsys):
    """Survivors say_lost_metrics 11 (find's log None: TypeError), 14 (find's own log: printed).
    The damaged checkpoint is the loop's to name, as it resumes."""
    run_config(tmp_path)
    for step in (2, 4):
        checkpoint.save(tmp_path, step, {"step": step}, [], keep=0)
    (tmp_path / "checkpoints" / "step_4" / checkpoint.MANIFEST).unlink()
    assert claimed(cfg_in(tmp_path, "trainer.resume=auto")) == [
        f"{tmp_path / 'metrics.jsonl'} is missing: the steps up to step_2 are not in it; the rows start after it, "
        "and the run's summary and curves count only those"
    ]
    assert capsys.readouterr().out == ""


def test_overwrite_deletes_a_checkpoint_the_earlier_run_was_still_writing(tmp_path):
    """Survivors written_by_a_run 22, 23 (`.tmp_step_N` kept as the user's)."""
    earlier_run(tmp_path)
    (tmp_path / "checkpoints" / ".tmp_step_4").mkdir()
    (tmp_path / "checkpoints" / ".tmp_step_4" / "controller.pt").write_bytes(b"")
    assert claimed(cfg_in(tmp_path, "run.overwrite=true")) == [
        f"run.overwrite=true: deleted the earlier run's metrics.jsonl, checkpoints/*step_* in {tmp_path}"
    ]
    assert not (tmp_path / "checkpoints").exists()


def test_overwrite_of_a_folder_whose_checkpoints_no_run_wrote_keeps_them_and_says_so(tmp_path):
    """Survivors _delete_run 52, 53 (what is said when no file of a run was found). A `step_2` without
    controller.pt (damaged, or a copy) holds a run's steps for the refusal, but is not deleted: the
    overwrite says it deleted nothing (it said "deleted the earlier run's files")."""
    run_config(tmp_path)
    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)  # no controller.pt: not surely a run's
    (tmp_path / "checkpoints" / "step_2" / "model.safetensors").write_text("x")
    assert claimed(cfg_in(tmp_path, "run.overwrite=true")) == [
        f"run.overwrite=true: nothing a run wrote was left to delete in {tmp_path}; kept what no run wrote in "
        "checkpoints/"
    ]
    assert (tmp_path / "checkpoints" / "step_2" / "model.safetensors").read_text() == "x"


def test_a_folder_holding_only_a_users_copy_of_a_checkpoint_takes_a_new_run(tmp_path):
    """Found writing these tests (fixed): run.overwrite=true keeps a user's copy beside the checkpoints
    (step_10_best: the fifteenth catalogue's t41), but holds_a_run counted any checkpoints/step_* as
    another run's steps: every later new run in the folder was refused, and each run.overwrite=true
    said it "deleted the earlier run's files" while it deleted nothing."""
    run_config(tmp_path)
    (tmp_path / "checkpoints" / "step_10_best").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_10_best" / "controller.pt").write_bytes(b"")
    claimed(cfg_in(tmp_path))
    assert (tmp_path / "checkpoints" / "step_10_best" / "controller.pt").exists()
