"""benchmarks/peers/collect_peers.py on a folder as peers.sh leaves it: verl's validation lines as
verl 0.9.1 prints them (numpy scalars), its actor's memory key, a job left out with its reason, and
a random-weight shape named."""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_benchmark

VAL = "step:{s} - val-aux/last_number/reward/mean@1:np.float64({a}) - val-core/last_number/acc/mean@1:np.float64({a})"


@pytest.fixture()
def folder(tmp_path):
    """A seed's folder with one verl job: validations at steps 0 and 5, steps 1-5 in its file logger."""
    f = tmp_path / "s0"
    (f / "task").mkdir(parents=True)
    (f / "task" / "task.json").write_text(json.dumps({"settings": {"prompts_per_step": 2, "group_size": 2}}))
    start = 1000.0
    (f / "jobs.tsv").write_text(f"verl\t0\t0\t{start}\t{start + 90}\t0\tbash verl_grpo.sh\n")
    lines = [(start + 30, VAL.format(s=0, a=0.125)), (start + 80, VAL.format(s=5, a=0.5))]
    (f / "verl.log").write_text("".join(f"{t}\t(TaskRunner pid=1) {text}\n" for t, text in lines))
    (f / "verl").mkdir()
    rows = [{"step": 0, "data": {"val-core/last_number/acc/mean@1": 0.125}}]
    rows += [{"step": s, "data": {"timing_s/step": 2.0 + s, "timing_s/gen": 1.0, "response_length/mean": 10.0,
                                  "actor/perf/max_memory_allocated_gb": 20.0 + s}} for s in range(1, 6)]  # fmt: skip
    rows[-1]["data"]["val-core/last_number/acc/mean@1"] = 0.5
    (f / "verl" / "verl_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_verls_numpy_validation_lines_give_the_curves_wall_times(folder):
    collect = load_benchmark("benchmarks/peers/collect_peers.py")
    job = collect.one_seed(folder, 3, [0.4])["jobs"]["verl"]
    assert job["val"] == [[0, 30.0, 0.125], [5, 80.0, 0.5]]
    assert job["time_to_target_s"] == {"0.4": 80.0}
    assert job["framework_peak_gib"] == 25.0  # actor/perf/max_memory_allocated_gb
    assert job["median_step_s"] == 6.5  # steps 4 and 5 (after the first 3)


def test_a_job_left_out_is_gone_from_the_figures_and_its_reason_kept(folder, monkeypatch, capsys):
    collect = load_benchmark("benchmarks/peers/collect_peers.py")
    out = folder.parent / "out.json"
    argv = ["collect_peers.py", str(folder), "--out", str(out), "--leave-out", "s0/verl=cut by its cap"]
    monkeypatch.setattr("sys.argv", argv)
    collect.main()
    record = json.loads(out.read_text())
    assert record["by_job"] == {} and record["seeds"][0]["jobs"] == {}
    assert record["left_out"] == [{"job": "s0/verl", "reason": "cut by its cap"}]
    monkeypatch.setattr("sys.argv", [*argv[:-1], "s0/trl=no such job"])
    with pytest.raises(SystemExit):
        collect.main()
    assert "--leave-out names no job of the folders: s0/trl" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", [*argv[:-1], "s0/verl"])
    with pytest.raises(SystemExit, match="want FOLDER/JOB=REASON"):
        collect.main()


def test_a_shapes_folder_says_its_weights_were_random(folder):
    """SHAPE=1.5b (peers.sh): throughput of a random-weight shape; the seed's record says so."""
    collect = load_benchmark("benchmarks/peers/collect_peers.py")
    assert collect.one_seed(folder, 3, [0.4])["shape"] is None  # (a peers.sh before SHAPE wrote no shape.txt)
    (folder / "shape.txt").write_text("")
    assert collect.one_seed(folder, 3, [0.4])["shape"] is None  # SmolLM2 itself
    (folder / "shape.txt").write_text("1.5b\n")
    assert collect.one_seed(folder, 3, [0.4])["shape"] == "1.5b"
