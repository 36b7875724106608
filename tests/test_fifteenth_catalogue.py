"""Faults the fifteenth bad-input catalogue found (tried by someone who did not write the code, on
a878c57 onwards): each test fails on the code before its fix. The others are beside the code they
test: t11 in tests/config/test_command_line.py, t14, t15 and t30 in tests/rewards/test_executor.py,
t18 and t25 in tests/controller/test_alerts.py, t35's message in tests/controller/test_progress.py."""

import json
from decimal import Decimal

import pytest

from rlpost.cli import main
from rlpost.config import ConfigError, load_config
from rlpost.config.command_line import sweep_jobs
from rlpost.data.dataset import DataError, read_rows
from rlpost.data.scalars import finite_number


def test_a_jsonl_row_whose_string_holds_a_line_separator_is_read(tmp_path):
    """t02: U+2028 (and U+0085, U+2029) may stand unescaped in a JSON string; the rows were split at it
    and row 5 refused as "not valid JSON", with later rows numbered one off."""
    rows = [{"prompt": f"what is {i}?\u2028\u0085\u2029", "ground_truth": str(i)} for i in range(6)]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    assert read_rows(str(path)) == rows
    path.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\r\n", encoding="utf-8")
    assert read_rows(str(path)) == rows  # (a Windows line end too)


def test_a_path_with_a_typo_in_its_extension_is_no_such_file_not_a_hub_id(tmp_path):
    """t04: `train.jsnl` beside train.jsonl went to datasets.load_dataset as a hub id, refused in its words."""
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "ground_truth": "1"}\n')
    with pytest.raises(DataError) as info:
        read_rows(str(tmp_path / "train.jsnl"))
    assert str(info.value) == (
        f"{tmp_path / 'train.jsnl'}: no such file (there is {tmp_path / 'train.jsonl'}); rlpost reads .jsonl, .json, "
        ".csv and .parquet files, datasets.save_to_disk folders and hub ids (org/name:split)"
    )
    with pytest.raises(DataError, match=r"^nowhere/rows: no such file; rlpost reads"):
        read_rows("./nowhere/rows")


def test_a_tiny_model_whose_head_size_is_odd_or_not_whole_is_refused_by_its_keys():
    """t05: model.tiny.hidden_size=100 with 4 heads (25 a head) failed in the rotary embedding's first forward."""
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", "model.tiny.hidden_size=100"], this_machine=False)
    assert str(info.value) == (
        "model.tiny.num_heads=4 splits model.tiny.hidden_size=100 into heads of 25: rotary embeddings need a whole, "
        "even head size; e.g. model.tiny.hidden_size=96"
    )
    with pytest.raises(ConfigError, match=r"into heads of 8\.5:"):
        load_config(["+recipe=quickstart", "model.tiny.hidden_size=34", "model.tiny.num_heads=4",
                     "model.tiny.num_kv_heads=2"], this_machine=False)  # fmt: skip
    load_config(["+recipe=quickstart", "model.tiny.hidden_size=120"], this_machine=False)  # 30 a head: taken


def test_a_list_item_set_with_brackets_is_told_the_dotted_key_once(capsys):
    """t08: `trainer.optim.betas[0]=0.5` was told twice to quote its value, which does not help."""
    assert main(["train", "+recipe=quickstart", "trainer.optim.betas[0]=0.5", "--cfg", "job"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "rlpost: config error: 'trainer.optim.betas[0]=0.5': a list item is set as trainer.optim.betas.0=VALUE (its "
        "number after a dot), or the whole list as trainer.optim.betas=[a,b]\n"
    )
    assert main(["train", "+recipe=quickstart", "run.dir=~/runs/a", "--cfg", "job"]) == 2
    assert capsys.readouterr().err.count("quote a value") == 1


@pytest.mark.parametrize(
    ("sweep", "said"),
    [
        ("trainer.optim.lr=interval(1e-5,1e-3)", "trainer.optim.lr=interval(1e-5,1e-3): Can only enumerate"),  # t09
        ("trainer.total_steps=range(5,1)", "trainer.total_steps=range(5,1) has no values (a range counts up"),  # t10
        ("run.seed=0,0", "run.seed=0,0 lists 0 more than once: the jobs would repeat each other"),  # t09b
        ("run.seed=choice(3,1,3)", "run.seed=choice(3,1,3) lists 3 more than once"),
        (
            "+recipe=glob(*)",
            "+recipe=glob(*): `rlpost train -m` runs listed values (a,b,c), range() or choice(): "
            "glob() picks among a config group's options, which rlpost's sweeps do not expand",
        ),  # t38
        (
            "run.seed=range(0,3,0)",
            "run.seed=range(0,3,0): range() arg 3 must not be zero; `rlpost train -m` runs "
            "listed values (a,b,c), range() or choice()",
        ),  # (no word of intervals: t38)
    ],
)
def test_a_sweep_without_values_of_its_own_is_refused_by_its_key(sweep, said):
    """t09: an interval ended in a raw HydraException; t10: an empty range in an IndexError; t09b: a value
    listed twice ran the same job twice without a word."""
    with pytest.raises(ConfigError) as info:
        sweep_jobs(["trainer.total_steps=1,2", sweep])
    assert str(info.value).startswith(said)
    assert "interval" not in str(info.value) or "interval(" in sweep


def test_an_empty_range_through_the_command_line_is_a_config_error(capsys):
    assert main(["train", "-m", "+recipe=quickstart", "run.seed=range(0,2)", "trainer.total_steps=range(5,1)"]) == 2
    assert capsys.readouterr().err.startswith("rlpost: config error: trainer.total_steps=range(5,1) has no values")


def test_a_decimal_score_is_a_number():
    """t13: a reward returning Decimal('1') was refused as "not a finite number"."""
    assert finite_number(Decimal("1")) == 1.0 and finite_number(Decimal("0.25")) == 0.25
    assert finite_number(Decimal("NaN")) is None and finite_number(Decimal("-Infinity")) is None
    assert finite_number(Decimal("1e400")) is None  # (inf as a float)


def test_the_plan_of_a_cpu_run_says_what_it_stands_for(capsys):
    """t12: `rlpost plan +recipe=quickstart` planned 80 GiB GPUs for a CPU run, and "0.00B parameters"."""
    assert main(["plan", "+recipe=quickstart"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("model: 0.") and "M parameters, 4 layers, hidden 128" in lines[0]
    assert lines[1] == (
        "trainer.device=cpu: this run uses no GPU; below is what the same config would hold on GPUs "
        "(trainer.device=cuda)"
    )
    assert lines[2] == "no GPU here: one of 80 GiB is assumed (rlpost plan --gpu-gb N for another)"
    assert main(["plan", "+recipe=quickstart", "trainer.device=cuda", "--gpu-gb", "80"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "memory plan per GPU (80 GiB), GiB:"


def test_a_json_array_whose_object_gives_a_key_twice_is_refused(tmp_path):
    """t01: a .json array kept the last of a ground truth given twice, where the same rows as .jsonl are refused."""
    path = tmp_path / "rows.json"
    path.write_text('[{"prompt": "a", "ground_truth": "1", "ground_truth": "2"}]')
    with pytest.raises(
        DataError, match=r"rows\.json: an object gives the key 'ground_truth' twice; give each key once"
    ):
        read_rows(str(path))


def test_a_csv_header_that_names_a_column_twice_is_refused(tmp_path):
    """t03: `prompt,ground_truth,ground_truth` was read with the last column's values."""
    path = tmp_path / "rows.csv"
    path.write_text("prompt,ground_truth,ground_truth\nwhat is 1+1?,2,3\n")
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    assert str(info.value) == (
        f"{path}: its header 'prompt,ground_truth,ground_truth' names 'ground_truth' twice; name each column once"
    )


@pytest.mark.parametrize("missing", ["model.safetensors", "start_eval.json"])
def test_a_cached_tiny_model_missing_a_file_is_named_before_anything_starts(tmp_path, monkeypatch, missing):
    """t31: without its weights the actors died loading it (a 109-line traceback, 25 s in); t32: without
    its start report the run ended in a KeyError."""
    from rlpost.tiny import build

    folder = tmp_path / "tiny-qwen2-x"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "start_eval.json"):
        (folder / name).write_text("{}")
    (folder / missing).unlink()
    monkeypatch.setattr(build, "tiny_model_dir", lambda model_cfg, data_cfg: folder)
    cfg = load_config(["+recipe=quickstart"], this_machine=False)
    with pytest.raises(build.CacheError) as info:
        build.ensure_tiny_model(cfg.model, cfg.data, log=lambda *_: None)
    assert str(info.value) == (
        f"model.path=tiny: the built model in {folder} has no {missing} (removed since it was built): delete that "
        "folder and it is built again"
    )


def test_a_stop_while_the_reward_file_runs_ends_its_worker_at_once(monkeypatch):
    """t29: SIGTERM while the user's reward file was still importing said "stopping now", then waited 81 s
    for the daemonic worker, which ignores SIGTERM, to finish the import."""
    from rlpost.controller import setup
    from rlpost.controller.signals import Stopped

    closed = []

    class Pool:
        def __init__(self, *args):
            pass

        def load(self):
            raise Stopped(15)

        def close(self):
            closed.append(True)

    monkeypatch.setattr(setup, "RewardPool", Pool)
    with pytest.raises(Stopped):
        setup.reward_pool(load_config(["+recipe=quickstart"], this_machine=False))
    assert closed == [True]


def test_a_class_named_as_the_reward_is_told_to_name_an_instance():
    """t33: `file.py:Scorer` (a class whose instances score) was told its function takes no sample."""
    from rlpost.rewards.base import check_call

    class Scorer:
        def __call__(self, sample):
            return 1.0

    with pytest.raises(TypeError) as info:
        check_call(Scorer, {}, "r.py:Scorer")
    assert str(info.value) == (
        "reward.fn='r.py:Scorer' is a class: rlpost calls reward.fn with each sample, which would make an instance of "
        "it, not a score; name an instance (scorer = Scorer() in the file, reward.fn=r.py:scorer) or a function"
    )
    check_call(Scorer(), {}, "r.py:scorer")  # an instance: taken


def test_overwrite_keeps_a_copy_of_a_checkpoint_kept_under_another_name(tmp_path):
    """t41: run.overwrite=true deleted checkpoints/step_10_best (a user's copy of step_10) with the run's own."""
    from rlpost.controller.run_dir import claim_run_dir, release_run_dir
    from tests.run_dirs import cfg_in, earlier_run

    earlier_run(tmp_path)
    best = tmp_path / "checkpoints" / "step_2_best"
    best.mkdir()
    (best / "controller.pt").write_bytes(b"")
    said = []
    claim_run_dir(cfg_in(tmp_path, "run.overwrite=true"), log=said.append)
    release_run_dir(tmp_path)
    assert not (tmp_path / "checkpoints" / "step_2").exists() and (best / "controller.pt").is_file()


def test_resume_auto_without_a_checkpoint_over_another_runs_steps_is_refused(tmp_path):
    """t42: trainer.resume=auto in a folder whose run wrote no checkpoint "started fresh" and deleted that
    run's metrics and samples (a run without resume may only with run.overwrite=true). The same run
    restarted in its process after its actors died (trainer.max_restarts) goes on as before."""
    from rlpost.controller.run_dir import claim_run_dir, release_run_dir
    from tests.run_dirs import cfg_in, run_config

    run_config(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    with pytest.raises(ConfigError) as info:
        claim_run_dir(cfg_in(tmp_path, "trainer.resume=auto"), log=lambda *_: None)
    assert str(info.value) == (
        f"run.dir={str(tmp_path)!r} holds another run's steps (metrics.jsonl), and no complete "
        "checkpoint to go on from (trainer.resume=auto would start afresh over them): choose another run.dir, or set "
        "run.overwrite=true to delete that run's logs and start again"
    )
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0}\n{"step": 1}\n'
    claim_run_dir(cfg_in(tmp_path, "trainer.resume=auto"), log=lambda *_: None, restart=True)
    release_run_dir(tmp_path)


def test_a_moved_run_folder_is_said_with_how_to_go_on_there_and_export_names_a_checkpoints_folders_run(tmp_path):
    """t35: a run folder renamed while the run trained was said to be deleted, "start the run again"; t40:
    `rlpost export RUN/checkpoints` was "not an rlpost run folder" without naming the run."""
    from rlpost.controller.checkpoint import CheckpointError, run_config
    from rlpost.controller.progress import check_run_folder

    with pytest.raises(CheckpointError) as info:
        check_run_folder(tmp_path / "gone", 8)
    assert "is gone, deleted or moved after step 8" in str(info.value)
    assert "if you moved it, go on there with trainer.resume=auto run.dir=<its new path>" in str(info.value)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("run: {}\n")
    with pytest.raises(FileNotFoundError) as info:
        run_config(tmp_path / "run" / "checkpoints")
    assert str(info.value).endswith(f"; it is a run's checkpoints folder: give its run, {tmp_path / 'run'}")


def test_a_ground_truth_written_as_a_small_decimal_keeps_its_digits(tmp_path):
    """t49: a JSONL ground truth 0.00001 reached the reward function as '1e-05' (str of the float)."""
    from rlpost.data.scalars import plain_number

    assert [plain_number(v) for v in (0.00001, 1.5e-05, -0.00007, 2.5, 123.0, 1e20, 7)] == [
        "0.00001", "0.000015", "-0.00007", "2.5", "123", "100000000000000000000", "7"]  # fmt: skip
    from rlpost.data.dataset import check_row

    assert check_row({"prompt": "1/100000=", "ground_truth": 0.00001}, "rows.jsonl: row 0")["ground_truth"] == "0.00001"


def test_the_doctor_names_a_package_whose_import_fails_and_goes_on(monkeypatch, capsys):
    """t52: a vLLM that raises at import (a build for another device) ended `rlpost doctor` in a traceback."""
    import importlib
    from types import SimpleNamespace

    def failing(name, *args):  # (no package is imported for real: a first import here changes the session's state)
        if name == "vllm":
            raise RuntimeError("Failed to infer device type")
        return SimpleNamespace(__version__="1.0")

    monkeypatch.setattr(importlib, "import_module", failing)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "vllm           cannot be imported (RuntimeError: Failed to infer device type)" in out
    assert out.splitlines()[-1].startswith("cuda")  # the rest of the list


def test_an_actor_that_dies_as_it_starts_is_one_line_naming_it(monkeypatch):
    """t53: a rollout actor whose vLLM import raised ended the run in Ray's 66-line traceback."""
    import ray

    from rlpost.controller import cluster

    class Died(ray.exceptions.ActorDiedError):
        def __str__(self):
            return "The actor died because of an error raised in its creation task ...\n\nRuntimeError: no device\n"

    def get(ref):
        raise Died()

    monkeypatch.setattr(cluster, "wait_first", lambda pending, *a: pending[0])
    monkeypatch.setattr(cluster.ray, "get", get)
    with pytest.raises(cluster.ActorsDidNotStart) as info:
        cluster.get_all(["ref"], labels={"ref": "rollout rank 0: generate"})
    assert (
        str(info.value)
        == "rollout rank 0 died as it started: RuntimeError: no device (`rlpost doctor` lists what imports)"
    )
    assert isinstance(info.value, cluster.RayDidNotStart)  # (the command line says it in one line, exit 1)


def test_a_full_disk_in_the_cache_is_one_line_naming_the_key(tmp_path, monkeypatch):
    """t56: the built tiny model's save on a full disk ended in a SafetensorError traceback and left its
    temporary folder; t57: the task's rows on a full disk ended in an OSError traceback."""
    import errno

    from rlpost.data import tasks
    from rlpost.tiny import build

    class Model:
        def to(self, device):
            return self

        def save_pretrained(self, folder):
            folder.mkdir()
            (folder / "config.json").write_text("{}")
            raise OSError(errno.ENOSPC, "No space left on device")

    final = tmp_path / "tiny-qwen2-x"
    with pytest.raises(build.CacheError) as info:
        build.save_built(final, Model(), None, "start_eval.json", {})
    assert str(info.value) == (
        f"model.cache_dir: writing the built model into {tmp_path} failed ([Errno 28] No space left on device); "
        "free space there or set model.cache_dir"
    )
    assert list(tmp_path.iterdir()) == []  # no half-written folder left

    def full(rows, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tasks, "write_jsonl", full)
    with pytest.raises(DataError) as info:
        tasks.cached_task(tmp_path / "rows", lambda: ([{"a": 1}], [{"a": 2}]))
    assert str(info.value) == (
        f"model.cache_dir: writing the task's rows into {tmp_path / 'rows'} failed (No space left on device); free "
        "space there or set model.cache_dir"
    )


def test_a_tracker_whose_package_is_missing_is_refused_before_anything_starts(monkeypatch):
    """t54: logger.backends with wandb, not installed, failed after Ray and the actors had started."""
    from rlpost.config import rules

    monkeypatch.setattr(rules, "installed", lambda module: module != "tensorboard")
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", "logger.backends=[console,tensorboard]"])
    assert str(info.value) == (
        "logger.backends has tensorboard, but tensorboard is not installed: pip install tensorboard, or leave it out"
    )


def test_a_sweeps_folder_is_named_as_one_by_plot_export_and_a_single_run(tmp_path, capsys):
    """t50: `rlpost plot SWEEP` and `rlpost export SWEEP` said only "not a run folder"; t51: a single run
    with run.dir=SWEEP (and trainer.resume=auto) "started fresh" and trained beside the sweep's jobs."""
    from rlpost.controller.run_dir import claim_run_dir
    from tests.run_dirs import cfg_in

    (tmp_path / "multirun.yaml").write_text("- {job: 0, overrides: [], done: true}\n")
    for job in ("0", "1", "10"):
        (tmp_path / job).mkdir()
    assert main(["plot", str(tmp_path)]) == 2
    runs = f"{tmp_path / '0'}, {tmp_path / '1'}, {tmp_path / '10'}"
    assert f"it is a sweep's folder (multirun.yaml): its runs are {runs}" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert f"it is a sweep's folder (multirun.yaml): its runs are {runs}" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"is a sweep's folder \(multirun.yaml\): go on with the sweep"):
        claim_run_dir(cfg_in(tmp_path, "trainer.resume=auto"), log=lambda *_: None)
    assert not (tmp_path / "config.yaml").exists() and not (tmp_path / "run.lock").exists()


def test_a_sweep_into_a_runs_folder_a_tiny_critic_and_a_resume_into_a_new_folder_are_said(tmp_path, capsys):
    """t66: a sweep with run.dir=<a single run's folder> put its jobs inside it; t59: critic.model_path=tiny
    was looked up on the hub; t62: trainer.resume=auto into a folder new this run said only "starting fresh"."""
    from rlpost.controller.run_dir import claim_run_dir, release_run_dir
    from tests.run_dirs import cfg_in, earlier_run

    earlier_run(tmp_path / "run")
    assert main(["train", "-m", "+recipe=quickstart", f"run.dir={tmp_path / 'run'}", "run.seed=0,1"]) == 2
    assert capsys.readouterr().err == (
        f"rlpost: config error: run.dir={tmp_path / 'run'} holds a run (config.yaml, metrics.jsonl), not a sweep: "
        "give the sweep a folder of its own\n"
    )
    assert not (tmp_path / "run" / "multirun.yaml").exists() and not (tmp_path / "run" / "0").exists()
    with pytest.raises(ConfigError, match=r"^critic.model_path=tiny: leave it empty to start the critic from"):
        load_config(["+recipe=ppo", "critic.model_path=tiny"], this_machine=False)
    said = []
    claim_run_dir(cfg_in(tmp_path / "new", "trainer.resume=auto"), log=said.append)
    release_run_dir(tmp_path / "new")
    assert said[0] == (
        f"trainer.resume=auto: run.dir={tmp_path / 'new'} is a new folder (not there before this run): nothing to "
        "resume"
    )
