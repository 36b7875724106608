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
    assert said == [
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


def test_an_environment_its_factory_could_not_make_ends_its_episode_said(capsys):
    """t38 (TRACEBACK): a factory that raised for a later row killed the rollout actor, reported as
    "a Ray worker or node of the run died" with resume advice; its error was shown nowhere."""
    from types import SimpleNamespace

    from rlpost.envs import ENVS, EpisodeRow
    from rlpost.rollout.base import SamplingParams
    from rlpost.rollout.episodes import Unmade, run_episodes
    from rlpost.rollout.worker import made_env
    from tests.rollout.test_episodes import EOS, TOK, ScriptedEngine, ScriptedEnv, ids

    def factory(row, options):
        if row.ground_truth == "bad":
            raise RuntimeError("no env for bad")
        return ScriptedEnv()

    ENVS.register("cat11_t38", factory)
    options = SimpleNamespace(name="cat11_t38")
    envs = [made_env(options, EpisodeRow("A=", truth, "arithmetic")) for truth in ("bad", "good")]
    assert isinstance(envs[0], Unmade) and isinstance(envs[1], ScriptedEnv)
    forever = [ids("x") + [EOS]] * 10
    engine = ScriptedEngine({"A=": forever, "B=": forever})
    batch = run_episodes(engine, TOK, [ids("A="), ids("B=")], envs, SamplingParams(n=1, max_tokens=200), 4, 60.0)
    assert batch["env_errors"].tolist() == [1, 0] and batch["env_turns"].tolist() == [1, 4]
    out = capsys.readouterr().out
    assert "env.name's factory raised RuntimeError('no env for bad') for this episode's row" in out


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


def skipping_rank(rank, world, port, model_dir, batch_path, out):
    """One critic update towards NaN returns: a non-finite gradient norm, a skipped step."""
    import torch
    import torch.distributed as dist

    from rlpost.config import load_config
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.roles.critic import CriticWorker
    from tests.roles.test_critic import COMMON

    torch.set_num_threads(1)
    cfg = load_config(COMMON + [f"trainer.world_size={world}", "trainer.layout=packed"])
    batch = torch.load(batch_path, weights_only=False)
    worker = CriticWorker(cfg, model_dir, rank, world, "127.0.0.1", port)
    try:
        shard = shard_batch(batch, step_plan(batch, cfg)[1])[rank]
        values = worker.compute_values(shard)["values"]
        shard["values"], shard["returns"] = values, torch.full_like(values, float("nan"))
        metrics = worker.update(shard)
        if rank == 0:
            torch.save(metrics, out)
        dist.barrier()
    finally:
        worker.shutdown()


def test_a_skipped_optimizer_step_counts_once_whatever_the_ranks(tmp_path):
    """t27: a reward of 1e300 gave "2 optimizer steps of the actor were skipped" in a run of 1
    optimizer step: the count was summed over the trainer ranks (the norm is global: all skip)."""
    import torch

    from rlpost.weightsync.transport import free_port
    from tests.helpers import run_ranks, save_tiny_model
    from tests.roles.test_critic import grouped_batch

    save_tiny_model(tmp_path / "model")
    torch.save(grouped_batch()[0], tmp_path / "batch.pt")
    run_ranks(skipping_rank, 2, free_port(), str(tmp_path / "model"), str(tmp_path / "batch.pt"), str(tmp_path / "o"))
    assert torch.load(tmp_path / "o", weights_only=False)["critic/skipped_steps"] == 1.0
