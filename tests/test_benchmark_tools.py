"""benchmarks/gpu_queue.py: the job list it reads and the command each job gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import load_benchmark

REPO = Path(__file__).resolve().parent.parent


def test_jobs_read_with_shared_overrides_from_the_environment(tmp_path, monkeypatch):
    queue = load_benchmark("benchmarks/gpu_queue.py")
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("# comment\na 1 x=1 $SHARED  # trailing\n\nb 4 y=2\n")
    monkeypatch.setenv("SHARED", "p=3 q=4")
    assert queue.read_jobs(jobs) == [("a", 1, ["x=1", "p=3", "q=4"]), ("b", 4, ["y=2"])]


def test_a_variable_not_set_names_the_line(tmp_path, monkeypatch):
    queue = load_benchmark("benchmarks/gpu_queue.py")
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("a 1 x=1\nb 2 $NOT_SET_ANYWHERE\n")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(SystemExit, match="line 2: set the variable"):
        queue.read_jobs(jobs)
    jobs.write_text("a one x=1\n")
    with pytest.raises(SystemExit, match="line 1: want `NAME GPUS"):
        queue.read_jobs(jobs)


def test_a_job_waits_for_the_job_it_names_and_resumes_its_own_checkpoints(tmp_path):
    queue = load_benchmark("benchmarks/gpu_queue.py")
    assert queue.command(tmp_path, "b", ["trainer.resume=@a/checkpoints/step_6"], []) is None
    (tmp_path / "a.done").touch()
    cmd = queue.command(tmp_path, "b", ["trainer.resume=@a/checkpoints/step_6"], ["c=1"])
    assert cmd[-3:] == [f"trainer.resume={tmp_path}/a/checkpoints/step_6", "c=1", f"run.dir={tmp_path / 'b'}"]
    (tmp_path / "b" / "checkpoints" / "step_2").mkdir(parents=True)
    assert "trainer.resume=auto" in queue.command(tmp_path, "b", [], [])
    for n in (1, 2):  # attempts stopped before a checkpoint: their folders set aside, the job starts again
        (tmp_path / "c").mkdir()
        (tmp_path / "c" / "metrics.jsonl").write_text(f"{n}\n")
        assert "trainer.resume=auto" not in queue.command(tmp_path, "c", [], [])
        assert not (tmp_path / "c").exists() and (tmp_path / f"c.attempt{n}" / "metrics.jsonl").read_text() == f"{n}\n"
    assert queue.command(tmp_path, "t", ["sh:", "pytest", "-q", "tests/gpu;", "true"], ["c=1"]) == [
        "bash",
        "-c",
        "pytest -q tests/gpu; true",
    ]


def test_the_queue_runs_jobs_on_free_gpus_in_order_and_stops_at_the_deadline(tmp_path, monkeypatch):
    """Each job gets the lowest free GPUs; one that needs more waits (and the jobs behind it);
    a finished job is marked done and skipped next time; at the deadline a running job gets SIGTERM."""
    import sys

    queue = load_benchmark("benchmarks/gpu_queue.py")
    script = (
        "import os, sys, time, pathlib; d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True); "
        "(d / 'gpus').write_text(os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(float(sys.argv[2]))"
    )
    monkeypatch.setattr(
        queue,
        "command",
        lambda root, name, overrides, common: [sys.executable, "-c", script, str(root / name), *overrides],
    )
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("a 1 0.5\nb 2 0.1\n")
    (tmp_path / "more.txt").write_text("c 1 0.1\nlong 1 60\n")  # a second list goes on after the first
    root = tmp_path / "runs"
    argv = ["gpu_queue.py", str(jobs), str(tmp_path / "more.txt"), "--dir", str(root), "--gpus", "2"]
    argv += ["--min-start", "0", "--stagger", "0"]
    monkeypatch.setattr(sys, "argv", argv + ["--deadline", "5", "--grace", "5"])
    queue.main()
    assert [(root / n / "gpus").read_text() for n in "abc"] == ["0", "0,1", "0"]
    assert [(root / f"{n}.done").exists() for n in ("a", "b", "c", "long")] == [True, True, True, False]
    log = (root / "commands.txt").read_text()
    assert log.index("a rc=0") < log.index("start b on GPU 0,1") < log.index("b rc=0") < log.index("start c on GPU 0")
    assert "long: deadline, SIGTERM" in log and "long rc=-15" in log
    (root / "c" / "gpus").unlink()
    monkeypatch.setattr(sys, "argv", argv + ["--deadline", "1", "--grace", "5"])
    queue.main()  # a, b and c are done: only `long` starts again
    assert not (root / "c" / "gpus").exists() and log.count("start long") + 1 == (
        root / "commands.txt"
    ).read_text().count("start long")


@pytest.mark.parametrize("tied", [True, False])
def test_scale_figures_count_the_matmul_parameters_and_the_mfu_by_hand(tmp_path, tied):
    """The parameters in MFU's 6 N are the model's, less the norms and the input embedding's lookup;
    MFU, tokens per GPU and the sync's GB/s follow from a run's metrics as written by hand."""
    import json

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    scale = load_benchmark("benchmarks/multi_gpu/scale_shapes.py")
    config = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4)
    config |= dict(num_key_value_heads=2, vocab_size=300, tie_word_embeddings=tied)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**config))
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    total = sum(p.numel() for p in model.parameters())  # a tied head counts once
    assert scale.matmul_params(config) == total - norms - (0 if tied else 300 * 64)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    row = {"timing_s/step": 4.0, "timing_s/update": 2.0, "perf/tokens_per_s": 1000.0, "weight_sync/bytes": 3e9}
    row |= {"timing_s/weight_sync": 1.5, "weight_sync/verified": 1.0, "timing_s/gen": 0.5, "response_length/mean": 10.0}
    lines = [{"step": 0}, {"step": 1, **row, "timing_s/update": 99.0}, {"step": 2, **row}, {"step": 3, **row}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    overrides = [f"model.path={tmp_path / 'm'}", "cluster.placement=split", "trainer.world_size=2"]
    assert scale.layout(overrides)["samples_per_step"] is None  # the batch not named: no generation rate
    lay = scale.layout([*overrides, "data.train_batch_size=4", "rollout.n=8"])
    assert (lay["gpus"], lay["trainer_gpus"], lay["rollout_gpus"]) == (3, 2, 1)
    out = scale.run_figures(tmp_path, lay, peak_flops=1e12)
    assert out["gen_tokens_per_s_per_gpu"] == pytest.approx(10.0 * 32 / 0.5 / 1)  # 1 rollout GPU
    assert "gen_tokens_per_s_per_gpu" not in scale.run_figures(tmp_path, lay | {"max_staleness": 1}, 1e12)
    n = scale.matmul_params(config)
    assert out["steps"] == [2, 3] and out["tokens_per_step"] == 4000.0
    assert out["update_mfu"] == pytest.approx(6 * n * 4000 / 2.0 / (2 * 1e12))
    assert out["tokens_per_s_per_gpu"] == pytest.approx(1000 / 3) and out["sync_gb_per_s"] == pytest.approx(2.0)


def test_a_run_is_recorded_with_its_last_attempts_overrides_less_the_queues_resume(tmp_path):
    """The command a collected run records: its last start line (a first attempt may have been refused
    and its job line fixed), without the `trainer.resume=auto` gpu_queue.py adds on going on; a job's
    own `trainer.resume=PATH` stays."""
    collect = load_benchmark("benchmarks/real_model/collect.py")
    (tmp_path / "commands.txt").write_text(
        "01:00:00 start a on GPU 0: x=1\n"
        "01:00:01 a rc=2\n"
        "01:00:02 start b on GPU 1,2: trainer.resume=/r/step_60 y=2\n"
        "01:01:00 start a on GPU 3: x=1 w=1\n"
        "01:09:00 start a on GPU 0: x=1 w=1 trainer.resume=auto\n"
    )
    assert collect.started(tmp_path) == {"a": ("0", ["x=1", "w=1"]), "b": ("1,2", ["trainer.resume=/r/step_60", "y=2"])}
    assert collect.train_command("0", ["x=1", "w=1"]) == "CUDA_VISIBLE_DEVICES=0 rlpost train x=1 w=1"


def test_a_run_started_through_run_7b_is_recorded_with_the_overrides_the_script_wrote(tmp_path):
    """A 7B job runs `rlpost train` through run_7b.sh inside detached.sh: its start line holds the
    script's words, and its overrides are in NAME.overrides; a job without that file keeps its line."""
    collect = load_benchmark("benchmarks/real_model/collect.py")
    script = "bash benchmarks/real_model/detached.sh {0} bash benchmarks/real_model/run_7b.sh {0}"
    (tmp_path / "commands.txt").write_text(
        f"01:00:00 start c on GPU 0,1: {script.format('c')} t=2\n01:00:01 start d on GPU 2: {script.format('d')}\n"
    )
    (tmp_path / "c.overrides").write_text("model.path=/m t=4 t=2\n")
    got = collect.started(tmp_path)
    assert got["c"] == ("0,1", ["model.path=/m", "t=4", "t=2"])
    assert got["d"][1][-1] == "d" and "run_7b.sh" in " ".join(got["d"][1])


def test_a_shell_jobs_run_is_recorded_with_its_overrides_and_the_variables_set_before_it(tmp_path):
    """A `sh:` job that sets a variable (PyTorch's allocator) before `python3 -m rlpost.cli train`:
    its overrides are the words after `train`, its variables come apart into the recorded command."""
    collect = load_benchmark("benchmarks/real_model/collect.py")
    (tmp_path / "commands.txt").write_text(
        "01:00:00 start e on GPU 0,1: A=1 B=x:y python3 -m rlpost.cli train m=1 trainer.resume=auto n=2\n"
        "01:00:01 start f on GPU 2: python3 -m rlpost.cli train m=3\n"
        "01:00:02 start g on GPU 3: m=4\n"
    )
    got, env = collect.started(tmp_path), collect.shell_env(tmp_path)
    assert got == {"e": ("0,1", ["m=1", "n=2"]), "f": ("2", ["m=3"]), "g": ("3", ["m=4"])}
    assert env == {"e": "A=1 B=x:y"}
    assert collect.train_command(*got["e"], env["e"]) == "CUDA_VISIBLE_DEVICES=0,1 A=1 B=x:y rlpost train m=1 n=2"


def test_bitwise_compares_every_value_but_time_and_memory(tmp_path):
    """benchmarks/real_model/bitwise.py (issue 38's check): a changed reward or a missing step is a
    difference; a changed timing, tokens/s or GB figure is not."""
    bitwise = load_benchmark("benchmarks/real_model/bitwise.py")
    ref = [{"step": 1, "reward/mean": 0.5, "timing_s/step": 3.0, "perf/update_peak_gb": 9.0, "perf/tokens_per_s": 7}]
    same = [dict(ref[0], **{"timing_s/step": 4.0, "perf/update_peak_gb": 9.5, "perf/tokens_per_s": 8})]
    assert bitwise.differences(ref, same) == []
    moved = [dict(ref[0], **{"reward/mean": 0.5000001})]
    assert bitwise.differences(ref, moved) == [{"step": 1, "key": "reward/mean", "reference": 0.5, "run": 0.5000001}]
    assert bitwise.differences(ref, []) == [{"step": None, "key": "rows", "reference": 1, "run": 0}]


def test_the_gap_comparison_pairs_seeds_over_the_steps_both_runs_have():
    gap = load_benchmark("benchmarks/real_model/gap_compare.py")

    def run(maxima, means, p999=None):
        n = len(maxima)
        return {
            "per_step": {
                "step": list(range(1, n + 1)),
                "logprob_gap_max": maxima,
                "logprob_gap_mean": means,
                "logprob_gap_p999": p999 or [None] * n,
                "logprob_gap_max_rollout_logprob": [-1.0] * n,
                "logprob_gap_max_trainer_logprob": [-2.0] * n,
            }
        }

    runs = {
        "gap_s1": run([0.5, 1.0, 9.0], [0.01, 0.03, 0.5], [0.2, 0.4, 0.1]),
        "gap_lora_s1": run([1.5, 0.5], [0.02, 0.04], [0.3, 0.2]),  # stopped after 2 steps: step 3 is not compared
        "gap_s2": run([1.0], [0.1]),  # no LoRA twin: no comparison
        "gap_s3": run([1.0], [0.1]),
        "gap_lora_s3": run([2.0], [0.1]),  # runs of before the tail was logged: no p999
    }
    runs["gap_lora_s1"]["per_step"] |= {"logprob_gap_max_token": [7.0, 8.0], "logprob_gap_max_position": [3.0, 0.0]}
    out = gap.compare(runs)
    assert set(out) == {"seed_1", "seed_3"}
    s1 = out["seed_1"]
    assert s1["steps"] == 2 and s1["full"]["max"] == 1.0 and s1["full"]["max_at_step"] == 2
    assert s1["lora"]["max"] == 1.5 and s1["max_ratio"] == 1.5 and s1["mean_ratio"] == 1.5
    assert s1["full"]["p999_max"] == 0.4 and s1["p999_max_ratio"] == 0.75
    assert s1["full"]["median_step_max"] == 0.75
    assert s1["lora"]["max_token_logprobs"] == {"rollout": -1.0, "trainer": -2.0}
    assert s1["lora"]["max_token"] == {"id": 7, "position": 3} and "max_token" not in s1["full"]  # step 1's: its max
    assert "p999_max" not in out["seed_3"]["full"] and out["seed_3"]["max_ratio"] == 2.0


def test_a_killed_runs_prompts_are_counted_against_the_uninterrupted_runs(tmp_path):
    """kill_resume.py: each step's prompts (samples.jsonl has n samples of each, in a row), a prompt
    trained twice, and the steps whose prompts differ from the reference's."""
    import json

    count = load_benchmark("benchmarks/real_model/kill_resume.py").count

    def write(run, steps):
        run.mkdir()
        rows = [{"step": s, "prompt": p, "response": "r"} for s, ps in steps.items() for p in ps for _ in range(2)]
        (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(tmp_path / "ref", {1: ["a", "b"], 2: ["c", "d"], 3: ["e", "f"]})
    write(tmp_path / "same", {1: ["a", "b"], 2: ["c", "d"], 3: ["e", "f"]})
    write(tmp_path / "other", {1: ["a", "b"], 2: ["c", "a"], 3: ["e", "f"]})
    same = count(tmp_path / "same", tmp_path / "ref", n=2)
    assert same["prompts_trained"] == 6 and same["distinct"] == 6 and same["trained_more_than_once"] == []
    assert same["steps_compared"] == 3 and same["steps_with_other_prompts"] == []
    other = count(tmp_path / "other", tmp_path / "ref", n=2)
    assert other["distinct"] == 5 and other["trained_more_than_once"] == ["a"]
    assert other["steps_with_other_prompts"] == [2]


def test_a_steps_wall_time_is_the_run_clock_between_consecutive_steps():
    collect = load_benchmark("benchmarks/real_model/collect.py")
    rows = [{"step": 1, "time/run_s": 100.0}, {"step": 2, "time/run_s": 110.5}, {"step": 3, "time/run_s": 120.0},
            {"step": 5, "time/run_s": 140.0}, {"step": 6, "time/run_s": 30.0}, {"step": 7}]  # fmt: skip
    assert collect.wall_steps(rows) == [None, 10.5, 9.5, None, None, None]  # a gap, a new process, no clock
    assert collect.wall_steps(rows[:3], {2}) == [None, 10.5, None]  # resumed from step 2: a new process's start
    log = "step 1\nresumed from /r/checkpoints/step_6 (step 6, weight version 6)\nresumed from /x (step 10, w)\n"
    assert collect.resumed_at(log) == {6, 10}


def test_the_async_summary_means_the_steps_without_validation_and_all_steps_by_hand():
    """Issue 41's figures: steps from 3 on, an interval across a resume (None) left out, the
    validation steps (every 5) out of the first mean and in the second."""
    summary = load_benchmark("benchmarks/real_model/async_summary.py")
    steps = list(range(1, 11))
    walls = [None, 9.0, 2.0, 4.0, 20.0, 3.0, None, 5.0, 6.0, 30.0]
    ones = [1.0] * 10
    per_step = {"step": steps, "wall_step_s": walls, "step_s": ones, "update_s": ones, "tokens_per_s": ones,
                "trainer_idle_frac": ones, "rollout_idle_frac": ones, "staleness_mean": [2.0] * 10,
                "is_weight_mean": ones, "is_weight_max": [1.5] * 9 + [2.0], "regenerated_groups": [0] * 9 + [3],
                "dropped_groups": [1] + [0] * 9}  # fmt: skip
    got = summary.summarize({"per_step": per_step, "attempts": 2, "val_accuracy": [[0, 0.1]]}, every=5)
    assert got["mean_wall_step_s"] == 4.0  # 2, 4, 3, 5, 6
    assert got["mean_wall_step_all_s"] == round(70 / 7, 3) and got["intervals"] == 7
    assert got["median_wall_step_s"] == 4.0 and got["is_weight_max"] == 2.0
    assert got["regenerated_groups"] == 3 and got["dropped_groups"] == 1 and got["mean_staleness"] == 2.0


def test_time_to_accuracy_counts_the_run_clock_to_the_first_evaluation_that_reaches_it():
    """Minutes to a target: the step walls summed to the first evaluation at or above it, a step's
    own timer where its wall is None (the first step, a resume); None when no evaluation reached it."""
    summary = load_benchmark("benchmarks/real_model/async_summary.py")
    per_step = {"step": [1, 2, 3, 4], "wall_step_s": [None, 30.0, None, 60.0], "step_s": [12.0, 1.0, 18.0, 1.0]}
    run = {"per_step": per_step, "val_accuracy": [[0, 0.1], [2, 0.3], [4, 0.5]]}
    assert summary.step_seconds(run) == [12.0, 30.0, 18.0, 60.0]
    assert summary.minutes_to(run, 0.3) == round(42 / 60, 2)
    assert summary.minutes_to(run, 0.31) == 2.0 and summary.minutes_to(run, 0.05) == 0.0
    assert summary.minutes_to(run, 0.6) is None
