"""The seventh catalogue of bad inputs (issue 39), tried by someone who did not write the code:
what it found that the rules of the config (tests/config/test_config.py: s01, s20, s37, s38), the
run folder (tests/controller/test_run_dir.py: s11, s12, s25) and the console (tests/test_console.py:
s15, s19) do not already cover. Each is now a clear error, or counted as what it is."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlpost.controller.scoring import not_loaded
from rlpost.rewards import RewardInput
from rlpost.rewards.pool import RewardPool


def test_a_reward_that_raises_a_keyboard_interrupt_is_an_error_of_the_sample_not_a_dead_worker(tmp_path):  # s07
    """A KeyboardInterrupt raised by the function (not a signal: the workers ignore SIGINT) killed
    its worker on every sample, printed a traceback each time and was called a crash."""
    (tmp_path / "r.py").write_text(
        "def reward(sample):\n    if sample.response == 'x':\n        raise KeyboardInterrupt('mine')\n    return 1.0\n"
    )
    pool = RewardPool(f"{tmp_path / 'r.py'}:reward", {}, 1, timeout_s=5, memory_mb=0, error_score=-1.0)
    try:
        pool.score([RewardInput("p", "1", "1", "x")])
        worker = pool.pool.procs[0]
        out = pool.score([RewardInput("p", r, "1", "x") for r in ("x", "1", "x", "1")])
        assert pool.pool.procs[0] is worker and worker.is_alive()  # the same worker scored them all
    finally:
        pool.close()
    assert out.scores == [-1.0, 1.0, -1.0, 1.0]
    assert out.counts["errors"] == 2 and out.counts["crashes"] == 0
    assert "KeyboardInterrupt: mine" in out.first_error


def test_a_reward_file_that_cannot_load_says_its_whole_error_and_names_a_low_memory_cap():  # s82
    numpy_like = RuntimeError(
        'a reward worker could not start: Traceback (most recent call last):\n  File "r.py", line 1\n'
        "ImportError: \n\nIMPORTANT: PLEASE READ THIS FOR ADVICE ON HOW TO SOLVE THIS ISSUE!\n"
        "your python interpreter from there."
    )
    said = str(not_loaded("r.py:score", numpy_like, memory_mb=60))
    assert said.startswith("reward.fn='r.py:score' could not be loaded: ImportError: IMPORTANT: PLEASE READ")
    assert said.endswith("(under reward.memory_mb=60, each reward worker's memory cap: one this low can stop the "
                         "file's imports; raise it, or 0 for none)")  # fmt: skip
    plain = str(not_loaded("r.py:score", RuntimeError("Traceback ...\nNameError: name 'x' is not defined"), 60))
    assert plain == "reward.fn='r.py:score' could not be loaded: NameError: name 'x' is not defined"
    assert "reward.memory_mb" not in str(not_loaded("r.py:score", numpy_like, memory_mb=0))


def test_a_temporary_folder_too_long_for_rays_sockets_is_refused_before_ray_starts(tmp_path, monkeypatch):  # s17
    import tempfile

    from rlpost.config import ConfigError
    from rlpost.controller.ray_checks import check_ray_can_start

    long = tmp_path / ("t" * 90)
    long.mkdir()
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)  # (gettempdir keeps what it found first)
    with pytest.raises(ConfigError, match=r"the temporary folder '.*ttt' \(TMPDIR\) is too long for Ray: its sockets'"):
        check_ray_can_start()
    monkeypatch.setenv("RAY_TMPDIR", "/tmp")  # Ray's own folder, short: fine
    check_ray_can_start()


def test_a_full_disk_leaves_no_half_row_and_names_the_file(tmp_path, monkeypatch):  # s32
    """At a full disk the run ended in three chained tracebacks, naming no file, and left its last
    metrics row cut mid-line (which a resume then called a row no run wrote)."""
    import errno
    import os

    from rlpost.metrics.trackers import JsonlTracker, TrackerError

    tracker = JsonlTracker(tmp_path)
    tracker.log({"reward/mean": 0.5}, 1)
    real = os.write

    def half_then_full(fd, data):
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(TrackerError) as info:
        tracker.log({"reward/mean": 0.75}, 2)
    monkeypatch.setattr(os, "write", real)
    tracker.close()
    tracker.close()  # twice: (the run's finally) nothing to raise
    assert str(info.value) == (
        f"cannot write step 2's row to {tmp_path / 'metrics.jsonl'} (No space left on device): free space there (or "
        "choose another run.dir) and go on from the newest checkpoint with trainer.resume=auto"
    )
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "reward/mean": 0.5}\n'


def test_an_export_that_does_not_fit_names_the_folder_and_leaves_nothing(tmp_path, monkeypatch, capsys):  # s79
    from safetensors import SafetensorError

    from rlpost.cli import main
    from rlpost.controller import export as exporting

    def full(*args, **kwargs):
        (tmp_path / "out" / "model.safetensors").write_text("half")
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")  # fmt: skip

    monkeypatch.setattr(exporting, "run_config", lambda run_dir: None)
    monkeypatch.setattr(exporting, "select", lambda run_dir, step, log: run_dir)
    monkeypatch.setattr(exporting, "check_base_model", lambda cfg, run_dir: None)
    monkeypatch.setattr(exporting, "write_export", full)
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "out"), "--dtype", "float32"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"rlpost export: cannot write {tmp_path / 'out'} (Error while serializing: IoError(Os")
    assert err.endswith("): free space, or give another --out\n") and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "rows, said",
    [
        ('{"step": 1, "reward/mean": "abc"}\n', "step 1's reward/mean is 'abc', not a number: not plotted"),
        ('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "timing_s/gen": true}\n', "step 2's timing_s/gen is True"),
    ],
)
def test_plot_refuses_rows_no_run_wrote(tmp_path, rows, said, capsys):  # s27
    from rlpost.cli import main

    (tmp_path / "metrics.jsonl").write_text(rows)
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "c.png")]) == 2
    assert said in capsys.readouterr().err and not (tmp_path / "c.png").exists()


def test_rlpost_data_refuses_an_option_and_its_key_given_both(tmp_path, capsys):  # s29
    from rlpost.cli import main

    argv = ["data", "arithmetic", "--out", str(tmp_path / "d"), "--digits", "1", "data.arithmetic_digits=2"]
    assert main(argv) == 2
    assert "data.arithmetic_digits given twice, as data.arithmetic_digits=2 and by its option (1): one" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "d").exists()


def test_the_hf_rollout_samples_as_rlpost_says_whatever_the_folders_generation_config(tmp_path):  # s23
    """A model folder whose generation_config.json set a repetition penalty and banned repeated
    tokens: the hf rollout applied them and the trainer did not (a log-prob gap of 1.6-1.9 nats,
    accuracy 0.85 -> 0.26). The rollout's log-probs are the model's own again."""
    import json

    from rlpost.rollout.base import SamplingParams
    from rlpost.rollout.hf import HFRolloutEngine
    from tests.helpers import reference_logprobs, save_tiny_model

    model, tok = save_tiny_model(tmp_path)
    config = json.loads((tmp_path / "generation_config.json").read_text())
    config.update({"repetition_penalty": 5.0, "no_repeat_ngram_size": 1, "min_new_tokens": 6})
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    engine = HFRolloutEngine(str(tmp_path), "float32", "cpu", tok.pad_token_id, tok.eos_token_id, batch_size=8)
    batch = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=0))
    expected = reference_logprobs(model, batch) * batch["response_mask"]
    torch.testing.assert_close(batch["rollout_logprobs"], expected, rtol=0, atol=1e-4)


def test_a_resume_on_other_training_rows_is_refused_by_name():  # s58
    """A training file rewritten with other rows resumed at the old run's place in the data, which
    counts rows that are not there, without a word."""
    from rlpost.data.dataset import DataError, PromptLoader, PromptRow

    rows = [PromptRow([i], f"{i}+1=", str(i + 1), "x") for i in range(12)]
    loader = PromptLoader(rows, 4, seed=0)
    next(loader)
    state = loader.state_dict()
    same = PromptLoader(list(rows), 4, seed=0)
    same.load_state_dict(state)  # the same rows: resumes
    assert (same.epoch, same.position) == (0, 4)
    changed = PromptLoader([*rows[:11], PromptRow([99], "11+1=", "13", "x")], 4, seed=0)  # one answer changed
    with pytest.raises(DataError, match=r"^the training rows are not those the checkpoint's run trained on \(12 rows "):
        changed.load_state_dict(state)
    old = {"epoch": 0, "position": 4}  # a checkpoint from before the fingerprint: taken as it is
    changed.load_state_dict(old)
    assert changed.position == 4


def test_a_run_folder_deleted_under_the_run_stops_it_by_name(tmp_path):  # s69
    from rlpost.controller.checkpoint import CheckpointError
    from rlpost.controller.progress import check_run_folder

    (tmp_path / "config.yaml").write_text("run: {}\n")
    check_run_folder(tmp_path, 4)
    (tmp_path / "config.yaml").unlink()
    with pytest.raises(CheckpointError, match=rf"^the run folder {tmp_path} \(its config.yaml\) is gone, deleted"):
        check_run_folder(tmp_path, 4)


def test_an_export_whose_checkpoint_a_live_run_rotates_away_says_so(tmp_path, monkeypatch):  # the eighth's e11
    """Exporting from a folder whose run is still training: its rotation deleted the step under
    export, and the error spoke of a missing adapter_config.json."""
    from rlpost.controller import export as exporting

    step = tmp_path / "checkpoints" / "step_3"
    step.mkdir(parents=True)

    def rotated(*args, **kwargs):
        import shutil

        shutil.rmtree(step)  # the live run's rotation, while the export reads
        raise OSError("Can't find 'adapter_config.json' at the step's adapter/")

    monkeypatch.setattr(
        exporting, "run_config", lambda run_dir: SimpleNamespace(model=SimpleNamespace(dtype="float32"))
    )
    monkeypatch.setattr(exporting, "select", lambda run_dir, step_, log: step)
    monkeypatch.setattr(exporting, "check_base_model", lambda cfg, run_dir: None)
    monkeypatch.setattr(exporting, "write_export", rotated)
    with pytest.raises(FileNotFoundError, match=r"step_3 was deleted while it was exported: a run training in "):
        exporting.export(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
