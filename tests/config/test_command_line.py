"""`rlpost train`'s Hydra conventions: --help, --cfg job and -m/--multirun, or a clear refusal."""

import subprocess
import sys

import pytest
import yaml

from rlpost import cli
from rlpost.config import ConfigError, load_config, to_yaml
from rlpost.config.command_line import parse_train_args, sweep_jobs


def test_help_lists_the_options_the_recipes_and_the_sections(capsys):
    assert cli.main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: rlpost train [OVERRIDE ...]")
    for text in ("--cfg job", "-m, --multirun", "quickstart, reinforce_pp", "  trainer      FSDP2 trainer."):
        assert text in out, text


def test_cfg_job_prints_the_composed_config_and_starts_nothing(capsys):
    overrides = ["+recipe=quickstart", "trainer.total_steps=7"]
    assert cli.main(["train", *overrides, "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    assert out == to_yaml(load_config(overrides)) and "total_steps: 7" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cfg", "hydra"], "--cfg hydra: rlpost prints only the run's own config, `--cfg job`"),
        (["--cfg"], "--cfg (nothing)"),
        (["--info"], "unknown option '--info' for `rlpost train`"),
    ],
)
def test_flags_rlpost_does_not_have_are_refused_by_name(argv, message, capsys):
    with pytest.raises(ConfigError, match="rlpost"):
        parse_train_args(["+recipe=quickstart", *argv])
    assert cli.main(["train", "+recipe=quickstart", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_sweep_without_multirun_says_how_to_ask_for_one(capsys):
    assert cli.main(["train", "+recipe=quickstart", "run.seed=1,2"]) == 2
    assert "sweep over the values with -m/--multirun" in capsys.readouterr().err


def test_sweep_jobs_expand_as_hydra_does():
    jobs = sweep_jobs(["+recipe=quickstart", "run.seed=1,2", "trainer.total_steps=range(3,5)", "data.x=[1,2]"])
    assert jobs == [
        ["+recipe=quickstart", f"run.seed={s}", f"trainer.total_steps={t}", "data.x=[1,2]"]
        for s in (1, 2)
        for t in (3, 4)
    ]


def test_multirun_checks_every_job_then_runs_them_one_by_one_into_numbered_folders(tmp_path, monkeypatch, capsys):
    ran = []

    class FakeJob:
        def __init__(self, command, **kwargs):
            ran.append(command)

        def wait(self):
            return 0 if len(ran) < 3 else 7

    monkeypatch.setattr(subprocess, "Popen", FakeJob)
    sweep = tmp_path / "sweep"
    argv = ["train", "-m", "+recipe=quickstart", f"run.dir={sweep}", "run.seed=0,1", "trainer.total_steps=1,2"]
    assert cli.main(argv) == 7  # the third job fails: the fourth does not run
    assert [c[:4] for c in ran] == [[sys.executable, "-m", "rlpost.cli", "train"]] * 3
    assert [c[4:] for c in ran] == [
        ["+recipe=quickstart", f"run.seed={s}", f"trainer.total_steps={t}", f"run.dir={sweep / str(i)}"]
        for i, (s, t) in enumerate([(0, 1), (0, 2), (1, 1)])
    ]
    listed = yaml.safe_load((sweep / "multirun.yaml").read_text())
    assert [j["job"] for j in listed] == [0, 1, 2, 3] and listed[3]["overrides"][-1] == f"run.dir={sweep / '3'}"
    go_on = f"to go on with the sweep: rlpost train -m {' '.join(argv[2:])} trainer.resume=auto"
    assert (
        f"sweep job 2 failed (exit 7); jobs 3.. did not run ({sweep}); once it is fixed, {go_on}"
        in capsys.readouterr().err
    )
    assert cli.main(argv) == 2  # the folder holds a sweep: a second one is refused, nothing overwritten
    assert "a sweep already ran in" in capsys.readouterr().err and len(ran) == 3
    assert [j["done"] for j in yaml.safe_load((sweep / "multirun.yaml").read_text())] == [True, True, False, False]
    ran.clear()
    FakeJob.wait = lambda self: 0
    assert cli.main([*argv, "trainer.resume=auto"]) == 0  # the twelfth catalogue's t105: the sweep goes on
    assert [c[4:] for c in ran] == [  # the two jobs not done, each resumed; the two done passed over
        [
            "+recipe=quickstart",
            "run.seed=1",
            f"trainer.total_steps={t}",
            "trainer.resume=auto",
            f"run.dir={sweep / str(i)}",
        ]
        for i, t in ((2, 1), (3, 2))
    ]
    assert "sweep job 0 (1 of 4): done before, in" in capsys.readouterr().out
    assert [j["done"] for j in yaml.safe_load((sweep / "multirun.yaml").read_text())] == [True] * 4
    assert cli.main([*argv[:-1], "trainer.total_steps=5", "trainer.resume=auto"]) == 2  # other jobs: refused
    assert "with other jobs than these" in capsys.readouterr().err


def test_a_signal_to_a_sweep_goes_to_its_job_which_it_waits_for(tmp_path, monkeypatch, capsys):
    """The tenth catalogue's t39: SIGTERM to `rlpost train -m` ended the sweep at once and left its
    job training with no parent; now the job gets the signal, the sweep waits and says how to go on."""
    import os
    import signal

    jobs = []

    class Job:
        def __init__(self, command, **kwargs):
            self.command, self.got, self.kwargs = command, [], kwargs
            jobs.append(self)

        def send_signal(self, signum):
            self.got.append(signum)

        def wait(self):
            os.kill(os.getpid(), signal.SIGTERM)  # to the sweep, while its first job runs
            return 128 + signal.SIGTERM if self.got else 0

    monkeypatch.setattr(subprocess, "Popen", Job)
    before = signal.getsignal(signal.SIGTERM)
    argv = ["train", "-m", "+recipe=quickstart", f"run.dir={tmp_path / 's'}", "run.seed=0,1"]
    assert cli.main(argv) == 128 + signal.SIGTERM
    assert len(jobs) == 1 and jobs[0].got == [signal.SIGTERM]  # passed on; the second job never started
    assert jobs[0].kwargs == {"start_new_session": True}  # a signal to the sweep's group reaches it once, forwarded
    err = capsys.readouterr().err
    assert err.rstrip().endswith(
        f"sweep stopped by SIGTERM in job 0 (exit 143); jobs 1.. did not run; to go on with the sweep: rlpost train -m "
        f"+recipe=quickstart run.dir={tmp_path / 's'} run.seed=0,1 trainer.resume=auto"
    )
    assert signal.getsignal(signal.SIGTERM) is before


def test_multirun_refuses_before_any_run_when_one_job_is_bad(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(subprocess, "Popen", lambda command, **kwargs: pytest.fail("a run started"))
    argv = ["train", "-m", "+recipe=quickstart", f"run.dir={tmp_path / 's'}", "trainer.world_size=1,3"]
    assert cli.main(argv) == 2
    assert "trainer.world_size=3 does not divide" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_multirun_with_cfg_job_prints_each_job(tmp_path, capsys):
    argv = ["train", "-m", "--cfg", "job", "+recipe=quickstart", f"run.dir={tmp_path}", "run.seed=3,4"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("# job ") == 2 and "seed: 3" in out and "seed: 4" in out
    assert not (tmp_path / "multirun.yaml").exists()


def test_hydras_own_settings_and_a_swept_run_dir_are_refused_by_name(tmp_path, capsys):
    """The seventh catalogue's s03 and s46: `hydra.run.dir=...` was taken and dropped (the run went
    to runs/<date>), and `-m run.dir=a,b` put both jobs under a/."""
    assert cli.main(["train", "+recipe=quickstart", f"hydra.run.dir={tmp_path}"]) == 2
    assert "hydra.run.dir: rlpost composes its config without Hydra's app" in capsys.readouterr().err
    assert cli.main(["train", "-m", "--cfg", "job", "+recipe=quickstart", f"run.dir={tmp_path}/a,{tmp_path}/b"]) == 2
    err = capsys.readouterr().err
    assert f"run.dir is swept ({tmp_path}/a, {tmp_path}/b): a sweep's runs go into numbered folders" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "text, said",
    [
        ("- job: 0\n  overrides: [run.seed=0\n", "while parsing a flow sequence"),
        ("just a note\n", "not a list of its jobs"),
    ],
)
def test_a_damaged_sweep_record_is_named_with_what_to_do(tmp_path, capsys, text, said):
    """The fourteenth catalogue's t03: a multirun.yaml cut short, or not a list, ended in a raw
    YAML ParserError or AttributeError, with and without trainer.resume=auto."""
    (tmp_path / "multirun.yaml").write_text(text)
    for resume in ([], ["trainer.resume=auto"]):
        assert cli.main(["train", "-m", "+recipe=quickstart", f"run.dir={tmp_path}", "run.seed=0,1", *resume]) == 2
        err = capsys.readouterr().err
        assert (
            err.startswith(f"rlpost: config error: {tmp_path / 'multirun.yaml'} is not a sweep's record (")
            and said in err
        )
        assert "for a new sweep give another run.dir, or move the file away" in err and "Traceback" not in err


def test_a_sweep_of_more_jobs_than_a_sweep_may_have_is_refused_before_they_are_listed(capsys):
    """The fourteenth catalogue's t04: range(0,100000000) listed its values until a MemoryError.
    Exactly 1000 jobs are a sweep; 1001 are refused naming the swept keys and their counts."""
    assert len(sweep_jobs(["run.seed=range(0,500)", "trainer.total_steps=1,2"])) == 1000
    with pytest.raises(ConfigError) as info:
        sweep_jobs(["run.seed=range(0,100000000)", "trainer.total_steps=1,2", "rollout.n=4"])
    assert str(info.value).startswith(
        "a sweep of more than 1000 jobs (values of run.seed (more than 1000), trainer.total_steps (2)): its runs go"
    )
    with pytest.raises(ConfigError, match=r"values of run.seed \(more than 1000\)\)"):
        sweep_jobs(["run.seed=range(0,1001)"])


def test_a_large_sweep_says_it_checks_its_jobs_before_they_start(tmp_path, monkeypatch, capsys):
    """The fourteenth catalogue's t05: 3000 jobs said nothing for minutes while each config was checked."""
    monkeypatch.setattr(cli, "checked_config", lambda job: None)  # the first job's config is refused: nothing runs
    assert cli.main(["train", "-m", "+recipe=quickstart", f"run.dir={tmp_path}", "run.seed=range(0,21)"]) == 2
    assert "rlpost: a sweep of 21 jobs: checking each config before the first starts" in capsys.readouterr().err
    assert cli.main(["train", "-m", "+recipe=quickstart", f"run.dir={tmp_path}", "run.seed=range(0,20)"]) == 2
    assert "checking each config" not in capsys.readouterr().err


def test_a_sweep_given_again_with_run_overwrite_starts_anew(tmp_path, monkeypatch):
    """The fifteenth catalogue's t11: a sweep's folder given again with run.overwrite=true was refused as
    "a sweep already ran", with no word of the overwrite asked for; now every job runs again with it."""
    import subprocess

    from rlpost import cli

    ran = []

    class FakeJob:
        def __init__(self, command, **kwargs):
            ran.append(command)

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakeJob)
    sweep = tmp_path / "sweep"
    argv = ["train", "-m", "+recipe=quickstart", f"run.dir={sweep}", "run.seed=0,1"]
    assert cli.main(argv) == 0 and cli.main(argv) == 2  # a second sweep in the folder: refused
    ran.clear()
    assert cli.main([*argv, "trainer.total_steps=5", "run.overwrite=true"]) == 0
    assert [c[4:] for c in ran] == [
        [
            "+recipe=quickstart",
            f"run.seed={s}",
            "trainer.total_steps=5",
            "run.overwrite=true",
            f"run.dir={sweep / str(i)}",
        ]
        for i, s in enumerate((0, 1))
    ]
    listed = yaml.safe_load((sweep / "multirun.yaml").read_text())
    assert [(j["job"], j["done"]) for j in listed] == [(0, True), (1, True)]


def test_a_sweep_job_that_died_before_its_first_checkpoint_starts_again_when_the_sweep_goes_on(tmp_path):
    """A resume over a run's steps with no checkpoint is refused (the fifteenth catalogue's t42); a sweep's
    own job in that state is started again over its logs when the sweep goes on, not refused."""
    from rlpost.sweep import again_if_unsaved

    job = ["+recipe=quickstart", "run.seed=1", "trainer.resume=auto", f"run.dir={tmp_path / '2'}"]
    assert again_if_unsaved(job, tmp_path / "2") == job  # never started: resumed (a new folder)
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    assert again_if_unsaved(job, tmp_path / "2") == [*job[:2], job[3], "run.overwrite=true"]
    (tmp_path / "2" / "checkpoints" / "step_1").mkdir(parents=True)
    (tmp_path / "2" / "checkpoints" / "step_1" / "controller.pt").write_bytes(b"")
    assert again_if_unsaved(job, tmp_path / "2") == job  # a checkpoint: resumed from it
    assert again_if_unsaved(job[:2] + job[3:], tmp_path / "2") == job[:2] + job[3:]  # not going on: as given
