"""Faults the eleventh bad-input catalogue found (tried by someone who did not write the code, on
4c0e953): each test fails on the code before its fix. Those that need a module's own fakes are
beside them: t97 in tests/controller/test_progress.py, t38 in tests/rollout/test_episodes.py, t27
in tests/roles/test_critic.py."""

import re

import pytest

from rlpost.config import ConfigError
from tests.run_dirs import cfg_in, earlier_run


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
        def __init__(self, command, **kwargs):
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
    assert "sweep stopped by SIGTERM after job 0 ended" in err and "to go on with job 0" not in err
    assert ("to go on with the sweep: rlpost train -m" in err) == (code != 0)  # job 0 done: the sweep passes it
    assert ("jobs 1.. did not run" in err) == (code != 0)


def test_a_resume_with_another_seed_is_refused_by_name(tmp_path):
    """t85 (SILENT): a resume with another `run.seed` kept the epoch's position but reshuffled it
    with the new seed: in epoch 0, 24 rows trained twice and 28 never."""
    from rlpost.config import load_config, to_yaml
    from rlpost.controller import checkpoint

    run = tmp_path / "run"
    checkpoint.save(run, 3, {"step": 3}, [], keep=0)
    (run / "config.yaml").write_text(to_yaml(load_config(["+recipe=quickstart", "run.seed=0"])))
    cfg = load_config(["+recipe=quickstart", "trainer.resume=auto", "run.seed=1"])
    with pytest.raises(ConfigError, match=r"other settings: run.seed=0 there, 1 here \(mid-epoch, prompts would "):
        checkpoint.check_resume(cfg, run)
    checkpoint.check_resume(load_config(["+recipe=quickstart", "trainer.resume=auto", "run.seed=0"]), run)


def test_a_resume_whose_metrics_were_deleted_says_so(tmp_path):
    """t91 (SILENT): a resume with metrics.jsonl deleted said nothing; the file then held only the
    new steps and the summary said "1 steps"."""
    from rlpost.controller import checkpoint
    from rlpost.controller.run_dir import claim_run_dir, release_run_dir

    earlier_run(tmp_path)
    checkpoint.save(tmp_path, 3, {"step": 3}, [], keep=0)
    (tmp_path / "metrics.jsonl").unlink()
    said = []
    claim_run_dir(cfg_in(tmp_path, "trainer.resume=auto", "trainer.total_steps=10"), log=said.append)
    release_run_dir(tmp_path)
    assert [s for s in said if "config.yaml held other settings" not in s] == [  # (total_steps 100 -> 10: said too)
        f"{tmp_path / 'metrics.jsonl'} is missing: the steps up to step_3 are not in it; the rows start after it, "
        "and the run's summary and curves count only those"
    ]
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    said.clear()
    claim_run_dir(cfg_in(tmp_path, "trainer.resume=auto", "trainer.total_steps=10"), log=said.append)
    release_run_dir(tmp_path)
    assert said == []


def test_a_closed_standard_output_is_said_in_one_line():
    """t72 (TRACEBACK): with standard output closed (`>&-`, `sys.stdout is None`) the first print
    ended in a raw AttributeError from console.py, and `train` left its lock."""
    import os
    import subprocess
    import sys

    from rlpost.console import ConsoleError, SteadyStream

    closed = SteadyStream(None, "stdout")
    with pytest.raises(ConsoleError, match=r"^cannot write to standard output \(it is closed\)$"):
        closed.write("x")
    closed.flush()
    assert closed.isatty() is False
    done = subprocess.run(
        [sys.executable, "-m", "rlpost.cli", "doctor", "--config-docs"],
        preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and done.stderr == "rlpost: cannot write to standard output (it is closed)\n"


def test_plan_prints_its_help_and_refuses_an_infinite_gpu(capsys):
    """t62: `rlpost plan --help` was refused as an unknown option (exit 2); t64: `--gpu-gb=1e400`
    was taken and printed "(inf GiB)"."""
    from rlpost import cli

    assert cli.main(["plan", "--help"]) == 0
    assert capsys.readouterr().out.startswith("`rlpost plan [--gpu-gb N] OVERRIDES...`")
    assert cli.main(["plan", "--gpu-gb=1e400", "+recipe=quickstart"]) == 2
    assert "--gpu-gb takes the GPU memory in GiB, above 0" in capsys.readouterr().err


def test_an_empty_model_path_or_cache_dir_is_named():
    """t53: `model.path=` read the current folder and called its tokenizer files damaged; t54:
    `model.cache_dir=` built a tiny model into the current folder."""
    from rlpost.config import load_config

    with pytest.raises(ConfigError, match=r"^model.path is empty: give a model folder"):
        load_config(["+recipe=quickstart", "model.path="])
    with pytest.raises(ConfigError, match=r"^model.cache_dir is empty: give a folder"):
        load_config(["+recipe=quickstart", "model.cache_dir="])


def test_a_repeated_key_whose_last_value_is_refused_is_not_said_to_be_used(capsys):
    """t39: "trainer.total_steps given 2 times (1, 1.5): the last, 1.5, is used", then the refusal
    of 1.5."""
    from rlpost import cli

    assert cli.main(["train", "+recipe=quickstart", "trainer.total_steps=1", "trainer.total_steps=1.5"]) == 2
    err = capsys.readouterr().err
    assert "is used" not in err and "trainer.total_steps=1.5" in err
    assert (
        cli.main(["train", "--cfg", "job", "+recipe=quickstart", "trainer.total_steps=1", "trainer.total_steps=2"]) == 0
    )
    assert capsys.readouterr().err == "rlpost: trainer.total_steps given 2 times (1, 2): the last, 2, is used\n"


@pytest.mark.parametrize("signum, code", [(15, 143), (2, 130)])
def test_a_second_signal_exits_with_its_own_code(tmp_path, monkeypatch, capsys, signum, code):
    """t103: two SIGTERMs exited 130, SIGINT's code; one SIGTERM exits 143."""
    from rlpost import cli
    from rlpost.controller import run
    from rlpost.controller.signals import SecondSignal

    def second(cfg, log=print):
        raise SecondSignal(signum)

    monkeypatch.setattr(run, "train", second)
    assert cli.main(["train", "+recipe=quickstart", f"run.dir={tmp_path}"]) == code
    assert "interrupted (second SIG" in capsys.readouterr().err


def test_an_exports_claim_left_by_a_killed_export_is_taken_over(tmp_path):
    """t99: SIGTERM during `rlpost export` left `--out` holding only `.rlpost-export`, and every
    later export was refused: "another export is writing into it", though none ran."""
    import os
    import subprocess
    import sys

    from rlpost.controller.files import take_claim

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    claim = tmp_path / ".rlpost-export"
    claim.write_text(gone.stdout.strip())  # its process has ended
    take_claim(claim)
    assert claim.read_text() == str(os.getpid())
    with pytest.raises(FileExistsError):  # a live one's stays
        take_claim(claim)
    claim.write_text("")  # one being written this instant
    with pytest.raises(FileExistsError):
        take_claim(claim)


def test_plot_names_the_run_folder_for_its_metrics_file_and_says_which_lists_are_curves(tmp_path):
    """t67: `rlpost plot RUN/metrics.jsonl` said "no metrics.jsonl (is it a run folder?)"; t69: a
    JSON file holding [1, 2, 3] was refused as having no "list of numbers"."""
    from rlpost.metrics.plot import plot_json
    from rlpost.metrics.summary import read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(FileNotFoundError, match=r"metrics.jsonl is a run's metrics file: give its run folder, "):
        read_metrics(tmp_path / "metrics.jsonl")
    (tmp_path / "list.json").write_text("[1, 2, 3]")
    with pytest.raises(ValueError, match=r"not just increasing integers, which read as steps"):
        plot_json(tmp_path / "list.json")


def test_a_step_whose_episodes_mostly_timed_out_or_failed_is_said():
    """t36: 32 of 32 episodes past `env.timeout_s` were counted in the metrics, never said; t32:
    an environment that failed in every episode got one line, with no count and no env.name."""
    from rlpost.config import load_config
    from rlpost.controller.alerts import Alerts

    cfg = load_config(["+recipe=quickstart", "env.name=retry", "env.timeout_s=2"])
    said = []
    alerts = Alerts(cfg, said.append)
    episodes = cfg.data.train_batch_size * cfg.rollout.n
    alerts.check(1, {"env/timeouts": float(episodes), "env/errors": episodes / 2})
    alerts.check(2, {"env/timeouts": float(episodes), "env/errors": 0.0})  # said when it starts, not again
    assert said == [
        f"warning: in step 1 {episodes} of {episodes} episodes ran past env.timeout_s=2 (env/timeouts) and ended "
        "there: raise env.timeout_s, or make env.name's steps faster",
        f"warning: in step 1 {episodes // 2} of {episodes} episodes of env.name=retry ended on an error of the "
        "environment (env/errors; its first is said above): fix the environment",
    ]
    alerts.check(3, {"env/timeouts": episodes / 2 - 1})
    assert len(said) == 2


def test_a_full_disk_at_a_checkpoint_is_said_as_a_full_disk(tmp_path):
    """t73: a full disk while the trainer ranks wrote a checkpoint read "a Ray worker or node of
    the run died (CheckpointError ... CheckpointException ranks ...)"; "No space left on device"
    was only inside Ray's 70-line dump."""
    import errno

    from torch.distributed.checkpoint.api import CheckpointException

    from rlpost.controller import checkpoint

    full = OSError(errno.ENOSPC, "No space left on device", "/disk/run/checkpoints/.tmp_step_2/x.distcp")

    class Group:
        def call(self, method, folder):
            try:
                raise CheckpointException("ranks", {0: (full, None), 1: (RuntimeError("unexpected pos"), None)})
            except BaseException as e:
                raise RuntimeError("ray task error") from e  # as Ray's task error carries it

    checkpoint.save(tmp_path, 1, {"step": 1}, [], keep=0)
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.save(tmp_path, 2, {"step": 2}, [Group()], keep=0)
    assert str(info.value) == (
        f"writing checkpoint {tmp_path / 'checkpoints' / 'step_2'} failed: OSError: [Errno 28] No space left on "
        f"device: '/disk/run/checkpoints/.tmp_step_2/x.distcp'; the newest complete checkpoint is "
        f"{tmp_path / 'checkpoints' / 'step_1'}; free space there, then run again with trainer.resume=auto"
    )


def test_a_run_dir_whose_name_is_too_long_is_named(tmp_path):
    """t80: a 300-character `run.dir` ended in a raw 29-line `OSError: File name too long`."""
    from rlpost.controller.run_dir import claim_run_dir

    with pytest.raises(ConfigError, match=r"^run.dir='.*a{300}': cannot use that path \(File name too long\)"):
        claim_run_dir(cfg_in(tmp_path / ("a" * 300)), log=lambda *_: None)


def test_an_override_hydra_cannot_parse_is_named():
    """t57: `trainer.total_steps=[1` and `trainer.optim.lr=1e-4=5` got Hydra's parser text ("no
    viable alternative at input '[1'") without the override named."""
    from rlpost.config import load_config

    for bad, why in [("trainer.total_steps=[1", "no viable alternative"), ("trainer.optim.lr=1e-4=5", "mismatched")]:
        with pytest.raises(ConfigError, match=rf"^'{re.escape(bad)}' cannot be read as KEY=VALUE \({why}"):
            load_config(["+recipe=quickstart", bad])


def test_a_temporary_folder_ray_cannot_write_is_named(tmp_path, monkeypatch):
    """t76: a `TMPDIR` that cannot be written ended in Ray's raw 38-line PermissionError."""
    import os

    from rlpost.controller.cluster import check_ray_can_start

    if os.geteuid() == 0:  # (root writes anywhere: the folder's mode is not what is checked then)
        monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path / "ro"))
    (tmp_path / "ro").mkdir(mode=0o555)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "ro"))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    with pytest.raises(ConfigError, match=r"the temporary folder '.*ro' \(TMPDIR, or RAY_TMPDIR\) cannot be written"):
        check_ray_can_start()
    monkeypatch.setenv("RAY_TMPDIR", "/tmp")  # Ray's own folder, writable: fine
    check_ray_can_start()


def test_a_resume_whose_training_rows_changed_is_refused_before_the_actors_start(tmp_path):
    """t84 (LATE): a training file that gained a row was refused with a clear message, but after the
    actors had started and loaded the checkpoint (21.5 s); other mismatches are refused at once."""
    from rlpost.controller.checkpoint import save
    from rlpost.controller.setup import load_data
    from rlpost.data.dataset import DataError, PromptLoader, PromptRow
    from rlpost.tiny.model import build_char_tokenizer

    tokenizer, quiet = build_char_tokenizer(), (lambda *_: None)
    loader, _, _ = load_data(cfg_in(tmp_path), tokenizer, quiet)  # what the controller loads before any actor
    next(loader)
    save(tmp_path, 1, {"loader": loader.state_dict()}, [], keep=0)
    resumed, _, _ = load_data(cfg_in(tmp_path, "trainer.resume=auto"), tokenizer, quiet)  # the same rows
    assert resumed.position == 0  # only checked here; the controller's resume puts it in place
    other = PromptLoader([PromptRow([i], f"p{i}", str(i), "arithmetic") for i in range(8)], 4, seed=0)
    save(tmp_path, 2, {"loader": other.state_dict()}, [], keep=0)  # the newest: a run on 8 other rows
    with pytest.raises(DataError, match=r"^the training rows are not those the checkpoint's run trained on \(8 rows "):
        load_data(cfg_in(tmp_path, "trainer.resume=auto"), tokenizer, quiet)


def test_a_reward_file_that_fails_after_the_start_is_said_as_such(tmp_path):
    """t29: the reward file was edited after the start's check to raise at import; at step 1 a worker
    that started then could not load it, and the run died in a 103-line chained traceback."""
    import torch

    from rlpost.config import load_config
    from rlpost.controller.scoring import Scorer
    from rlpost.data.dataset import PromptRow
    from rlpost.rewards.pool import RewardPool
    from rlpost.tiny.model import build_char_tokenizer

    reward = tmp_path / "chg.py"
    reward.write_text("def score(sample):\n    return 1.0\n")
    cfg = load_config(["+recipe=quickstart", f"reward.fn={reward}:score", "reward.num_workers=2"])
    pool = RewardPool(cfg.reward.fn, {}, 2, 10.0, 0, 0.0)
    try:
        pool.load()  # the first worker loads it as the run starts
        reward.write_text("raise RuntimeError('file being edited')\n")
        batch = {"response_ids": torch.tensor([[5, 6], [6, 5]]), "response_mask": torch.ones(2, 2, dtype=torch.bool)}
        rows = [PromptRow([1], "1 + 1 =", "2", "mine")]
        with pytest.raises(ConfigError) as info:  # the second worker starts for its share, on the edited file
            Scorer(cfg, build_char_tokenizer(), pool, log=lambda *_: None).score(rows, batch, 2)
    finally:
        pool.close()
    assert str(info.value) == (
        f"reward.fn='{reward}:score': a reward worker started during the run could not load it: ValueError: "
        f"reward.fn='{reward}:score': running {reward} raised RuntimeError at line 1: file being edited; it loaded "
        "when the run started, so the file (or what it imports) has changed since: fix it, then go on with "
        "trainer.resume=auto"
    )


def test_a_local_ray_whose_raylet_died_as_it_started_is_said_with_its_logs(monkeypatch, tmp_path, capsys):
    """t102 (TRACEBACK): the raylet killed while `ray.init` started the local Ray ended the run with
    Ray's raw `Exception: The current node timed out during startup`. Now one line says so, names
    the session logs, and what Ray started is shut down; joining a cluster (`cluster.address`) keeps
    its own handling (`start_ray`'s ConnectionError)."""
    import ray

    from rlpost.cli import main
    from rlpost.controller import cluster

    def raylet_gone(**kwargs):
        raise Exception(
            "The current node timed out during startup. This could happen because some of the raylet failed to "
            "startup or the GCS has become overloaded."
        )

    shut = []
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setattr(ray, "init", raylet_gone)
    monkeypatch.setattr(ray, "shutdown", lambda: shut.append(True))
    with pytest.raises(cluster.RayDidNotStart) as info:
        cluster.init_ray(address="local")
    assert str(info.value).startswith("Ray's local instance did not start (The current node timed out during startup.")
    assert f"are in {tmp_path}/ray/session_latest/logs." in str(info.value) and shut == [True]
    with pytest.raises(Exception, match="^The current node timed out"):  # a cluster's address: not this one's to say
        cluster.init_ray(address="10.0.0.1:6379")
    run = tmp_path / "run"
    monkeypatch.setenv("RAY_TMPDIR", "/tmp")  # (tmp_path is too long for Ray's socket paths: refused before)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # (another test's Ray in this process: not this run's)
    code = main(["train", "+recipe=quickstart", "trainer.total_steps=1", f"run.dir={run}", "trainer.val_every=0"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("rlpost: Ray's local instance did not start (The current node")
