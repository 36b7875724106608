"""The nineteenth catalogue of bad inputs and faults (tried by someone who did not write the code):
each entry that was not handled well, now handled, and a test that failed before. Entries also
tested elsewhere: t68 (tests/controller/test_checkpoint.py: a full disk with no checkpoint yet),
t126's validation (tests/controller/test_start_pass_k.py)."""

import json
import signal
import subprocess
import sys

import pytest
import torch

from rlpost.config import ConfigError, load_config


def refusal(*overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", *overrides])
    return str(info.value)


def test_t01_the_dual_clip_bound_is_refused_where_the_loss_never_reads_it():
    assert refusal("algo.name=cispo", "algo.clip_ratio_c=10") == (
        "algo.clip_ratio_c=10 is read only by PPO's clipped loss; algo.name=cispo takes the cispo loss, which "
        "ignores it: leave algo.clip_ratio_c out"
    )
    assert "algo.name=gspo takes the gspo loss" in refusal("algo.name=gspo", "algo.clip_ratio_c=2")
    assert load_config(["+recipe=quickstart", "algo.clip_ratio_c=10"]).algo.clip_ratio_c == 10  # grpo reads it


def test_t22_t134_greedy_sampling_is_named_as_the_cause_of_alike_samples():
    from rlpost.controller.alerts import no_signal

    assert refusal("rollout.top_k=1").startswith("rollout.top_k=1 keeps only the likeliest token: a prompt's")
    cfg = load_config(["+recipe=quickstart", "rollout.top_p=1e-9"])
    said = no_signal(cfg, 1, {"reward/uniform_groups": 1.0, "reward/mean": 0.5})["uniform"]
    assert said.endswith(
        "rollout.top_p=1e-09 keeps only the likeliest token, so a prompt's samples are alike (leave it out: off by "
        "default)"
    )
    plain = no_signal(load_config(["+recipe=quickstart"]), 1, {"reward/uniform_groups": 1.0, "reward/mean": 0.5})
    assert "every answer is right or every one wrong (reward/mean 0.500)" in plain["uniform"]


def test_t40_a_reward_function_may_be_named_by_its_attribute_path(tmp_path):
    from rlpost.data.userfile import check_file, load_from_file

    path = tmp_path / "meth.py"
    path.write_text("class C:\n    @staticmethod\n    def score(sample):\n        return 1.0\n")
    check_file(f"{path}:C.score", "reward.fn")
    assert load_from_file(f"{path}:C.score", "reward.fn")(None) == 1.0
    with pytest.raises(AttributeError, match=r"meth.py defines no name 'D'$"):
        check_file(f"{path}:D.score", "reward.fn")
    with pytest.raises(AttributeError, match=r"meth.py defines no function 'C.nope'$"):
        load_from_file(f"{path}:C.nope", "reward.fn")


def test_t58_t60_a_signal_that_took_rays_processes_stops_the_wait_at_once():
    """SIGTERM to the whole process group (`timeout`, Slurm) took Ray's GCS and raylet: the step never
    ended, and a minute later Ray's client ended the program with its own message. Now each second's
    look of the waits stops the run, and `train` ends it as a signal that took the workers."""
    from rlpost.controller.signals import Stopped, StopSignals, WorkersGone

    stop = StopSignals()
    try:
        stop.before_start, stop.signal = False, signal.SIGTERM
        stop.check()  # Ray's processes alive: the step under way finishes
        stop.ray_gone = lambda: True
        with pytest.raises(WorkersGone, match="SIGTERM reached Ray's own processes too"):
            stop.check()
        stop.finishing = True
        stop.check()  # the report and shutdown finish whatever comes
        stop.finishing, stop.starting = False, True
        with pytest.raises(Stopped):
            stop.check()
    finally:
        stop.restore()


def test_t58_t60_train_ends_such_a_step_as_one_whose_workers_died(monkeypatch):
    from rlpost.controller import run
    from rlpost.controller.signals import Stopped, WorkersGone

    stops = []

    class Controller:
        def __init__(self, cfg, log, restarts, stop, started):
            self.step, self.started = 0, started  # (a run from its start)

        def run(self, stop):
            stop.before_start, stop.signal = False, signal.SIGTERM
            raise WorkersGone("SIGTERM reached Ray's own processes too")

        def stop_on(self, signum, workers_gone=False):
            stops.append((signum, workers_gone))
            raise Stopped(signum)

        def shutdown(self):
            pass

    monkeypatch.setattr(run, "Controller", Controller)
    with pytest.raises(Stopped):
        run.train(load_config(["+recipe=quickstart"]))
    assert stops == [(signal.SIGTERM, True)]


def test_t63_optimize_level_2_is_refused_before_ray_starts():
    code = "from rlpost.controller.ray_checks import check_ray_can_start\ncheck_ray_can_start()"
    out = subprocess.run([sys.executable, "-OO", "-c", code], capture_output=True, text=True)
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == (
        "rlpost.config.schema.ConfigError: python -OO strips docstrings, which Ray's own modules edit as they "
        "import (its dashboard then fails and Ray does not start): unset it, or use optimize level 1 "
        "(PYTHONOPTIMIZE=1, python -O)"
    )


def test_t88_keys_of_another_version_in_config_yaml_are_left_out_with_a_note(tmp_path):
    from rlpost.config.compose import to_yaml
    from rlpost.controller.checkpoint import run_config

    saved = to_yaml(load_config(["+recipe=quickstart", f"run.dir={tmp_path}"]))  # what a run writes
    (tmp_path / "config.yaml").write_text(saved + "legacy_section:\n  x: 1\n")
    text = (tmp_path / "config.yaml").read_text().replace("run:\n", "run:\n  legacy_flag: true\n", 1)
    (tmp_path / "config.yaml").write_text(text)
    said = []
    cfg = run_config(tmp_path, log=said.append)
    assert cfg.run.dir == str(tmp_path) and not hasattr(cfg.run, "legacy_flag")
    assert said == [
        f"note: {tmp_path / 'config.yaml'} holds keys this rlpost does not have (run.legacy_flag, legacy_section): "
        "written by another version of rlpost (or by hand); they are left out"
    ]
    run_config(tmp_path, log=said.append)
    assert len(said) == 1  # said once
    (tmp_path / "config.yaml").write_text(text.replace("total_steps: ", "total_steps: many # ", 1))
    with pytest.raises(ConfigError, match=r"config.yaml: not a config rlpost can read \(trainer.total_steps\)"):
        run_config(tmp_path)  # a known key's value that does not fit is still refused


def test_t108_a_row_nested_past_the_recursion_limit_is_named(tmp_path):
    from rlpost.data.dataset import DataError, read_text_rows

    deep = "[" * 5000 + "]" * 5000
    rows = tmp_path / "deep.jsonl"
    rows.write_text('{"prompt": "a", "ground_truth": "1"}\n' + '{"prompt": "b", "extra_info": ' + deep + "}\n")
    with pytest.raises(DataError) as info:
        read_text_rows(rows, ".jsonl")
    assert str(info.value) == (
        f"{rows}: row 1: nested too deeply to read (lists or objects in each other past Python's recursion "
        "limit); flatten it"
    )
    array = tmp_path / "deep.json"
    array.write_text('[{"prompt": "b", "extra_info": ' + deep + "}]")
    with pytest.raises(DataError, match=r"deep.json: nested too deeply to read"):
        read_text_rows(array, ".json")


def test_t115_a_step_whose_loss_had_no_token_is_not_called_a_collapse():
    from rlpost.controller.alerts import no_signal

    cfg = load_config(["+recipe=quickstart", "algo.overlong_filter=true", "rollout.max_response_length=2"])
    nothing = {"actor/entropy": 0.0, "actor/grad_norm": 0.0, "actor/ppo_ratio_max": float("-inf")}
    found = no_signal(cfg, 1, {**nothing, "response_length/truncated_frac": 1.0})
    assert "collapsed" not in found and found["no_tokens"] == (
        "warning: no token of step 1 was in the loss (actor/ppo_ratio_max -inf), so nothing trained: "
        "algo.overlong_filter=true leaves truncated responses out, and every one was: raise "
        "rollout.max_response_length=2"
    )
    collapsed = no_signal(cfg, 1, {**nothing, "actor/ppo_ratio_max": 1.0})
    assert "no_tokens" not in collapsed and "collapsed" in collapsed


def test_t125_rlpost_says_its_own_version(capsys):
    from importlib.metadata import version

    from rlpost.cli import main

    assert main(["--version"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"rlpost {version('rlpost')}")
    assert main(["doctor"]) == 0
    first = capsys.readouterr().out.splitlines()[0].split()
    assert first[0] == "rlpost" and first[1].rstrip(",") == version("rlpost")  # rlpost's row, first


def test_t126_an_error_score_that_rewards_failures_is_said_at_the_start():
    from rlpost.controller.alerts import setting_warnings

    said = setting_warnings(load_config(["+recipe=quickstart", "reward.error_score=1.0"]))
    assert (
        "warning: reward.error_score=1 scores a sample whose reward failed at least as a right answer (1): the run "
        "is rewarded for failing; 0 (the default) scores it as wrong (validation counts a failed sample wrong "
        "whatever it scores)"
    ) in said
    assert not [w for w in setting_warnings(load_config(["+recipe=quickstart"])) if "error_score" in w]


@pytest.mark.parametrize("key", ["reward.timeout_s", "weight_sync.timeout_s", "env.tool_timeout_s"])
def test_t127_t129_t131_a_timeout_past_a_week_is_refused_by_its_range(key):
    assert refusal(f"{key}=1000000000000").endswith("must be <= 604800")


def test_t126_the_scorer_gives_validation_the_samples_that_failed():
    from rlpost.controller.scoring import Scorer
    from rlpost.data.batch import Batch
    from rlpost.data.dataset import PromptRow
    from rlpost.rewards.executor import Scores

    class Pool:
        def score(self, samples, interrupted=None):
            counts = {"errors": 1, "timeouts": 0, "bad_values": 0, "crashes": 0}
            return Scores([1.0, 1.0, 0.0], counts, "sample 1: ValueError: wrong answer", [1])

    class Tokenizer:
        def batch_decode(self, ids, skip_special_tokens):
            return ["x"] * len(ids)

    batch = Batch({"response_ids": torch.ones(3, 2, dtype=torch.long), "response_mask": torch.ones(3, 2).bool()})
    rows = [PromptRow([1], "p", "g", "s")]
    scores, errors, failed = Scorer(load_config(["+recipe=quickstart"]), Tokenizer(), Pool(), log=print).score(
        rows, batch, n=3, rule_only=True
    )
    assert scores.tolist() == [1.0, 1.0, 0.0] and failed.tolist() == [False, True, False] and errors["errors"] == 1
    assert json.dumps(errors)  # (the counts stay plain numbers: they become metrics)
