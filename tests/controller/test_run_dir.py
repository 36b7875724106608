"""A run folder belongs to one run (`rlpost.controller.run_dir`): a second run is refused while
the first holds the folder's lock, a folder holding another run's steps is refused unless this
run resumes it or asks to overwrite it, and nothing is deleted unasked."""

import json
import os
import socket
import stat
import subprocess
import sys
import time
from datetime import datetime

import pytest

from rlpost.config import ConfigError, load_config, to_yaml
from rlpost.controller.run_dir import claim_run_dir
from rlpost.controller.run_lock import LOCK, release_run_dir
from tests.run_dirs import cfg_in, earlier_run, run_config

pytestmark = pytest.mark.timeout(60)


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


def test_another_folders_checkpoint_is_not_resumed_into_a_folder_holding_a_third_run(tmp_path):
    """The ninth catalogue's n69: trainer.resume=<another run's checkpoint> with run.dir holding a
    third run appended the new steps to that run's metrics and replaced its config.yaml."""
    from rlpost.controller.run_dir import resumes_elsewhere

    other, here = tmp_path / "other", tmp_path / "here"
    earlier_run(other)
    earlier_run(here)
    checkpoint = other / "checkpoints" / "step_2"
    cfg = cfg_in(here, "trainer.total_steps=5")
    cfg.trainer.resume = str(checkpoint)  # (load_config would read the checkpoint: this one is a stand-in)
    before = (here / "config.yaml").read_text()
    with pytest.raises(ConfigError) as info:
        claim_run_dir(cfg, log=lambda *_: None)
    assert f"and trainer.resume={checkpoint} is a checkpoint of {other}: its steps would be" in str(info.value)
    assert (here / "config.yaml").read_text() == before and (here / "metrics.jsonl").read_text().count("step") == 3
    assert resumes_elsewhere(str(checkpoint), here) == other and resumes_elsewhere(str(other), here) == other
    assert resumes_elsewhere(str(here / "checkpoints" / "step_2"), here) is None  # its own: resumed as before
    assert resumes_elsewhere("auto", here) is None and resumes_elsewhere("none", here) is None


def test_a_run_that_never_got_past_its_start_is_not_in_the_way(tmp_path):
    run_config(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "start/pass@1": 0.5}\n')
    claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    release_run_dir(tmp_path)


def test_a_live_runs_lock_refuses_a_second_run_and_a_dead_ones_is_taken_over(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (tmp_path / LOCK).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "since": 0}))
        with pytest.raises(ConfigError, match=rf"is in use by another run \(pid {holder.pid} on host "):
            claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    finally:
        holder.communicate()  # the run ends when its input does
    assert holder.returncode == 0  # checked whether it lives, not signalled
    said = []
    claim_run_dir(cfg_in(tmp_path), log=said.append)  # its process is gone
    assert said == [f"{tmp_path / LOCK}: the run that held it (pid {holder.pid}) is gone; taking the folder over"]
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()  # the folder is this run's now
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


def dead_pid():
    """The pid of a process of this host that has ended."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def refusal(cfg):
    with pytest.raises(ConfigError) as info:
        claim_run_dir(cfg, log=lambda *_: None)
    return str(info.value)


def test_the_lock_names_this_runs_process_host_and_start_and_is_a_plain_readable_file(tmp_path):
    umask = os.umask(0o022)
    try:
        before = time.time()
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
        after = time.time()
    finally:
        os.umask(umask)
    lock = json.loads((tmp_path / LOCK).read_text())
    assert lock.keys() == {"pid", "host", "since"}
    assert (lock["pid"], lock["host"]) == (os.getpid(), socket.gethostname())
    assert before <= lock["since"] <= after  # what a second run's refusal shows as "since"
    assert stat.S_IMODE((tmp_path / LOCK).stat().st_mode) == 0o644  # others can read who holds it; not executable
    release_run_dir(tmp_path)


def test_the_refusal_of_a_held_folder_names_the_folder_the_holder_its_start_and_the_lock(tmp_path):
    since = datetime(2026, 3, 14, 15, 9, 26).timestamp()
    (tmp_path / LOCK).write_text(json.dumps({"pid": 4242, "host": "elsewhere", "since": since}))
    assert refusal(cfg_in(tmp_path)) == (
        f"run.dir={str(tmp_path)!r} is in use by another run (pid 4242 on host elsewhere, since 2026-03-14 15:09:26); "
        f"wait for it to end or choose another run.dir (if that run is gone, delete {tmp_path / LOCK})"
    )
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == 4242  # kept


def test_a_lock_that_cannot_be_read_is_kept_and_refused_as_a_live_runs(tmp_path):
    """Half written (its run starting this moment), or a lock of this host with no pid to check."""
    for lock in ('{"pid": 12', json.dumps({"host": socket.gethostname(), "since": 0})):
        (tmp_path / LOCK).write_text(lock)
        assert refusal(cfg_in(tmp_path)) == (  # (not "pid None on host None, since 1970": cat20's t61, t62)
            f"run.dir={str(tmp_path)!r}: {tmp_path / LOCK} is not a lock rlpost wrote, so no run that holds the "
            "folder can be named (a run starting in it this moment writes one); if none is, delete it "
            f"(rm {tmp_path / LOCK}) and start again"
        )
        assert (tmp_path / LOCK).read_text() == lock


def test_a_stale_lock_that_another_starting_run_removes_first_is_still_taken_over(tmp_path):
    (tmp_path / LOCK).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname(), "since": 0}))

    def meanwhile(_):  # said just before this run removes the stale lock: another run removed it first
        (tmp_path / LOCK).unlink()

    claim_run_dir(cfg_in(tmp_path), log=meanwhile)
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    release_run_dir(tmp_path)


def test_a_folder_with_only_metrics_or_only_a_checkpoint_of_another_run_is_refused(tmp_path):
    for run_dir in (tmp_path / "metrics", tmp_path / "checkpoint"):
        run_config(run_dir)
    (tmp_path / "metrics" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')  # stopped after step 1
    (tmp_path / "checkpoint" / "checkpoints" / "step_2").mkdir(parents=True)
    for run_dir in (tmp_path / "metrics", tmp_path / "checkpoint"):
        written = (run_dir / "config.yaml").read_text()
        assert "holds another run's steps" in refusal(cfg_in(run_dir, "trainer.total_steps=7"))
        assert (run_dir / "config.yaml").read_text() == written and not (run_dir / LOCK).exists()
    assert (tmp_path / "metrics" / "metrics.jsonl").read_text() == '{"step": 0}\n{"step": 1}\n'


def test_a_metrics_file_that_is_not_json_or_not_utf8_is_kept_and_refused(tmp_path):
    run_config(tmp_path)
    for text, line in ((b"step 3 of my notes\n", 1), (b'{"step": 0}\n\xff\xfe not utf-8\n', 2)):
        (tmp_path / "metrics.jsonl").write_bytes(text)
        assert f"metrics.jsonl line {line} is not a row rlpost wrote" in refusal(cfg_in(tmp_path))
        assert (tmp_path / "metrics.jsonl").read_bytes() == text


def test_overwrite_deletes_every_file_of_the_earlier_run_and_says_which_even_without_checkpoints(tmp_path):
    run_config(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')  # no checkpoint saved yet
    (tmp_path / "samples.jsonl").write_text('{"step": 1, "response": "4"}\n')
    for name in ("summary.json", "curves.png", "notes.txt"):
        (tmp_path / name).write_text("x")
    said = []
    claim_run_dir(cfg_in(tmp_path, "run.overwrite=true"), log=said.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "notes.txt", LOCK]
    assert said == [
        "run.overwrite=true: deleted the earlier run's metrics.jsonl, samples.jsonl, summary.json, curves.png in "
        f"{tmp_path}"
    ]
    release_run_dir(tmp_path)


def test_overwrite_deletes_the_runs_checkpoints_events_and_profiles_and_keeps_a_users_files_beside_them(tmp_path):
    """The seventh catalogue's s11 and s12: overwrite deleted all of checkpoints/ (a user's notes
    in it too) and kept the earlier run's TensorBoard events and profiles, which then showed under
    the new run. Now it deletes by name what a run writes there, and says what it kept. (Events and
    profiles only of a run that wrote them: the sixteenth catalogue's t141, in the next test.)"""
    run_config(tmp_path, "logger.backends=[console,jsonl,tensorboard]", "trainer.profile_step=2")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    made = [
        "checkpoints/step_1/controller.pt",
        "tensorboard/events.out.tfevents.1.vm.1.0",
        "profile/update_step2_rank0.txt",
        "wandb/offline-run-20261128_010101-abc/run-abc.wandb",  # the ninth catalogue's n52: kept, `wandb sync`
        "wandb/offline-run-20261128_010101-abc/logs/debug.log",  # would have uploaded the old run with the new one
        "wandb_runs.txt",  # the W&B runs it made (the sixteenth catalogue's t88: the user's there stay)
    ]
    mine = ["checkpoints/NOTES.txt", "profile/my_trace.json", "checkpoints/step_99/model.safetensors"]  # an export
    mine += ["wandb/offline-run-20261127_090000-myeval/run-myeval.wandb", "wandb/README_eval.txt"]
    for name in made + mine:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "wandb_runs.txt").write_text("offline-run-20261128_010101-abc\n")
    (tmp_path / "wandb" / "latest-run").symlink_to("offline-run-20261128_010101-abc")  # W&B's links into it
    (tmp_path / "wandb" / "debug.log").symlink_to("offline-run-20261128_010101-abc/logs/debug.log")
    said = []
    claim_run_dir(cfg_in(tmp_path, "run.overwrite=true"), log=said.append)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["checkpoints/NOTES.txt", "checkpoints/step_99/model.safetensors", "config.yaml",
                    "profile/my_trace.json", LOCK, "wandb/README_eval.txt",
                    "wandb/offline-run-20261127_090000-myeval/run-myeval.wandb"]  # fmt: skip
    assert not (tmp_path / "tensorboard").exists() and not any(p.is_symlink() for p in (tmp_path / "wandb").iterdir())
    assert said == [
        f"run.overwrite=true: deleted the earlier run's metrics.jsonl, wandb_runs.txt, wandb/offline-run-20261128_"
        f"010101-abc, checkpoints/*step_*, tensorboard/events.out.tfevents.*, profile/update_step2_rank* in "
        f"{tmp_path}; kept what no run wrote in wandb/, checkpoints/, profile/"
    ]
    release_run_dir(tmp_path)


def test_overwrite_keeps_events_and_profiles_where_the_replaced_run_wrote_none(tmp_path):
    """The sixteenth catalogue's t141: a run without the tensorboard backend or a profile step was
    replaced, and a user's event file and notes in tensorboard/ and profile/ went with it, by pattern."""
    run_config(tmp_path)  # the quickstart: console and jsonl, no profile step
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    mine = ["tensorboard/events.out.tfevents.1795900001.vm.myeval", "profile/update_step_notes.txt"]
    for name in mine:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    said = []
    claim_run_dir(cfg_in(tmp_path, "run.overwrite=true"), log=said.append)
    assert all((tmp_path / name).read_text() == "x" for name in mine)
    assert said == [
        f"run.overwrite=true: deleted the earlier run's metrics.jsonl in {tmp_path}; kept what no run wrote in "
        "tensorboard/, profile/"
    ]
    release_run_dir(tmp_path)


def test_a_hand_written_config_yaml_with_the_runs_sections_is_kept_and_refused(tmp_path):
    """The seventh catalogue's s25: a config.yaml written by hand in rlpost's sections (a comment,
    a few keys) passed for a run's and was replaced. A run's starts with the header runs write; one
    written before the header has every main section and no comment."""
    own = "# tuned by hand\nrun: {seed: 3}\ntrainer: {total_steps: 50}\n"
    (tmp_path / "config.yaml").write_text(own)
    assert "holds a config.yaml that no rlpost run wrote" in refusal(cfg_in(tmp_path))
    assert (tmp_path / "config.yaml").read_text() == own
    (tmp_path / "config.yaml").write_text(to_yaml(load_config(["+recipe=quickstart"])))  # a run's, before the header
    claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    assert (tmp_path / "config.yaml").read_text().startswith("# rlpost: this run's config, written by the run")
    release_run_dir(tmp_path)


def test_a_users_config_yaml_that_is_not_utf8_is_kept_and_refused(tmp_path):
    mine = b"lr: 0.1\nname: caf\xe9\n"  # latin-1
    (tmp_path / "config.yaml").write_bytes(mine)
    assert "holds a config.yaml that no rlpost run wrote" in refusal(cfg_in(tmp_path))
    assert (tmp_path / "config.yaml").read_bytes() == mine


@pytest.mark.parametrize("overrides", [(), ("run.overwrite=true",), ("trainer.resume=auto",)])
def test_a_users_own_logs_in_the_folder_are_refused_by_name_and_kept(tmp_path, overrides):
    """A folder holding the user's own samples.jsonl (no run's config.yaml beside it): a fresh run
    emptied it, even with logger.samples_per_step=0 (the fifth catalogue's f10)."""
    mine = '{"prompt": "1+1=", "ground_truth": "2"}\n' * 3
    (tmp_path / "samples.jsonl").write_text(mine)
    assert refusal(cfg_in(tmp_path, *overrides)) == (
        f"run.dir={str(tmp_path)!r} holds samples.jsonl that no rlpost run wrote (it has no config.yaml), which a "
        "run would replace: choose another run.dir (a new or empty folder), or move them"
    )
    assert (tmp_path / "samples.jsonl").read_text() == mine and sorted(os.listdir(tmp_path)) == ["samples.jsonl"]


def test_rows_that_no_run_wrote_in_a_runs_logs_are_named_and_kept(tmp_path):
    """A line added by hand to a run's metrics.jsonl, or rows without a step (f04, f10b): a run
    keeps or drops the rows by step, and such a line failed in the middle of a resume."""
    run_config(tmp_path)
    text = '{"step": 0}\n{"step": 1}\n# lr lowered from here\n'
    (tmp_path / "metrics.jsonl").write_text(text)
    for overrides in ((), ("trainer.resume=auto",)):
        assert refusal(cfg_in(tmp_path, *overrides)) == (
            f"run.dir={str(tmp_path)!r}: metrics.jsonl line 3 is not a row rlpost wrote ('# lr lowered from here'); "
            "a run keeps or drops that file's rows by step: remove the line (edited by hand?) or move the file"
        )
    assert (tmp_path / "metrics.jsonl").read_text() == text
    (tmp_path / "metrics.jsonl").write_text('{"model": "mine", "acc": 0.91}\n')
    assert "metrics.jsonl line 1 is not a row rlpost wrote" in refusal(cfg_in(tmp_path))


CLAIM = """
import sys
from rlpost.config import ConfigError, load_config
from rlpost.controller.run_dir import claim_run_dir
try:
    claim_run_dir(load_config(["+recipe=quickstart", f"run.dir={sys.argv[1]}"]), log=lambda *_: None)
    print("claimed")
except ConfigError as e:
    print("refused:", e)
"""


def test_two_runs_that_find_one_dead_lock_do_not_both_take_the_folder(tmp_path):
    """Run B found the dead lock too and deleted A's new one: both ran in the folder (helper's
    race, shown with a second process). Now B waits for A's claim to finish, then finds A's lock."""
    (tmp_path / LOCK).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname(), "since": 0}))
    other = []

    def b_starts_while_a_takes_over(_message):
        other.append(subprocess.Popen([sys.executable, "-c", CLAIM, str(tmp_path)], stdout=subprocess.PIPE, text=True))
        with pytest.raises(subprocess.TimeoutExpired):  # B waits on the folder while A holds the claim
            other[0].wait(timeout=5)

    claim_run_dir(cfg_in(tmp_path), log=b_starts_while_a_takes_over)
    out, _ = other[0].communicate(timeout=120)
    assert out.startswith(f"refused: run.dir={str(tmp_path)!r} is in use by another run (pid {os.getpid()} on host ")
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    release_run_dir(tmp_path)


def test_a_dead_lock_that_keeps_coming_back_is_not_a_claim_without_a_lock(tmp_path, monkeypatch):
    """When every takeover finds the dead lock back (an unguarded claimant), the claim used to end
    its two tries and go on with no lock at all."""
    stale = json.dumps({"pid": dead_pid(), "host": socket.gethostname(), "since": 0})
    (tmp_path / LOCK).write_text(stale)
    real_open = os.open

    def comes_back(path, flags, *args):  # between the takeover's unlink and its create, every time
        if str(path).endswith(LOCK) and flags & os.O_EXCL:
            (tmp_path / LOCK).write_text(stale)
            raise FileExistsError(path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", comes_back)
    with pytest.raises(ConfigError, match=r"run.lock came back each time it was taken over"):
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    assert not (tmp_path / "config.yaml").exists()  # refused before anything was written


def test_a_folder_holding_only_an_earlier_runs_samples_is_refused_not_trimmed(tmp_path):
    """The fourteenth catalogue's t33 (read from the code): with its metrics.jsonl gone and no
    checkpoint, a folder's samples.jsonl rows past step 0 were trimmed away by a new run."""
    run_config(tmp_path)
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"step": 1, "prompt": "1+1=", "response": "2", "reward": 1.0}\n')
    with pytest.raises(ConfigError, match=r"holds another run's steps"):
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
    assert samples.read_text().startswith('{"step": 1')
    samples.write_text("not a row\n")  # a line no run wrote: kept and refused too
    with pytest.raises(ConfigError):
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)
