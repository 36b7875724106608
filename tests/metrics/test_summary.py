"""The run summary: read from metrics.jsonl (one row per step, the last attempt's), computed from the
rows by hand here, and printed with the numbers it computed."""

import json
from types import SimpleNamespace

import pytest

from rlpost.metrics.summary import format_summary, read_metrics, summarize, write_report


def step_row(step, reward, **extra):
    row = {
        "step": step,
        "reward/mean": reward,
        "timing_s/step": 1.0 + step,
        "timing_s/gen": 0.25 * step,
        "timing_s/update": 0.5,
        "timing_s/update_worker": 0.4,  # a part of update: not a phase of its own
        "weight_sync/version": float(step),
        "weight_sync/verified": 1.0,
    }
    return {**row, **extra}


def rows_of_a_run():
    start = {"step": 0, "val/accuracy": 0.5, "timing_s/val": 0.5}
    steps = [step_row(s, reward=s / 20) for s in range(1, 21)]
    steps[9]["val/accuracy"], steps[9]["timing_s/val"] = 0.9, 0.25  # step 10: the best
    steps[19]["val/accuracy"], steps[19]["timing_s/val"] = 0.8, 0.25  # step 20
    steps[19]["weight_sync/verified"] = 0.0  # weight_sync.verify=false for once
    return [start, *steps]


def test_summary_numbers_are_those_of_the_rows():
    rows = rows_of_a_run()
    s = summarize(rows, wall_s=100.0)
    assert s["steps"] == 20 and s["last_step"] == 20 and s["wall_s"] == 100.0
    assert s["train_s"] == sum(1.0 + k for k in range(1, 21))
    assert s["phase_s"] == {"gen": 0.25 * sum(range(1, 21)), "update": 0.5 * 20}
    assert s["val_s"] == 1.0
    assert s["val_accuracy"] == {"start": 0.5, "best": 0.9, "best_step": 10, "final": 0.8, "final_step": 20}
    # the first and the last tenth of the steps: 2 each
    assert s["reward"] == {
        "first": (0.05 + 0.10) / 2,
        "last": (0.95 + 1.0) / 2,
        "steps_averaged": 2,
        "failed_samples": 0,
        "failed_by_kind": {"timeouts": 0, "crashes": 0, "bad_values": 0},
    }
    assert s["weight_syncs"] == {"done": 20, "verified": 19}


def test_summary_of_a_run_without_steps_or_validation():
    s = summarize([{"step": 0, "start/pass@1": 0.5}])
    assert s["steps"] == 0 and s["val_accuracy"]["start"] is None and s["reward"]["first"] is None
    text = format_summary(s, {"metrics": "m.jsonl"})
    assert text.splitlines() == [
        "summary: 0 steps",
        "  weight syncs: 0 done, 0 verified by checksum",
        "  metrics: m.jsonl",
    ]


def test_printed_summary_says_what_the_numbers_are():
    text = format_summary(summarize(rows_of_a_run(), wall_s=125.0), {"checkpoints": "runs/x/checkpoints/step_20"})
    assert text.splitlines() == [
        "summary: 20 steps in 2 min 5 s",
        "  time: training 3 min 50 s (gen 23%, update 4%); validation 1.0 s",
        "  validation accuracy: start 0.500, best 0.900 (step 10), final 0.800 (step 20)",
        "  reward: 0.075 (mean of the first 2 steps) -> 0.975 (the last)",
        "  weight syncs: 20 done, 19 verified by checksum",
        "  checkpoints: runs/x/checkpoints/step_20",
    ]


def test_the_summary_says_how_many_samples_failed_to_score():
    """A reward that raised on every sample ended with "reward: 0.000 -> 0.000" and exit 0, the
    failures only in the metrics (the fifth catalogue's r06, r08)."""
    rows = [step_row(1, 0.0, **{"reward/errors": 30.0, "reward/timeouts": 2.0}), step_row(2, 0.0)]
    rows[1].update({"reward/errors": 4.0, "reward/crashes": 1.0, "reward/bad_values": 3.0, "reward/mean_raw": 9.0})
    s = summarize(rows)  # reward/errors counts every failed sample, the other kinds say which (eleventh's t22)
    assert s["reward"]["failed_samples"] == 34
    assert format_summary(s, {}).splitlines()[2] == (
        "  reward: 0.000 (mean of the first 1 step) -> 0.000 (the last); 34 samples failed to score "
        "(reward/errors: 2 timeouts, 1 crashes, 3 bad values)"
    )


def test_a_step_written_twice_counts_once_with_its_last_row(tmp_path):
    rows = [{"step": 0}, {"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.2}]
    rows.append({"step": 2, "reward/mean": 0.3})  # step 2 again: an attempt that died wrote it first
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert read_metrics(tmp_path) == [{"step": 0}, {"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.3}]


def test_bad_metrics_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, oops\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2: not a metrics row"):
        read_metrics(tmp_path)


def test_report_writes_the_summary_and_the_curves(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_of_a_run()))
    lines = []
    logger = SimpleNamespace(plot=True, backends=["console", "jsonl"])
    summary = write_report(tmp_path, 30.0, "none written", logger, log=lines.append)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "curves.png").is_file()
    assert lines[0].splitlines()[-1] == f"  curves: {tmp_path / 'curves.png'}"
    empty = tmp_path / "empty"  # the jsonl tracker was off
    empty.mkdir()
    write_report(empty, 1.0, "none", SimpleNamespace(plot=True, backends=["console"]), log=lines.append)
    assert lines[1].startswith("summary: 0 steps") and "curves" not in lines[1]
    assert not (empty / "curves.png").exists()


def test_a_run_stopped_in_its_first_step_is_reported_without_curves(tmp_path):
    """A stop signal during step 1 (its scoring given up): the start's row alone; the report was a
    traceback of the plot ("no trained step yet")."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/accuracy": 0.5}) + "\n")
    lines = []
    write_report(tmp_path, 5.0, "none", SimpleNamespace(plot=True, backends=["jsonl"]), log=lines.append)
    assert lines[0].startswith("summary: 0 steps") and "curves" not in lines[0]
    assert not (tmp_path / "curves.png").exists()
