"""Bad inputs that used to give a wrong result without a word, or fail only after the actors had
started (the catalogue of tests/test_bad_inputs.py, continued): each is now a right result or a
clear error before any actor starts."""

import json

import numpy as np
import pytest
import torch

from rlpost.config import ConfigError, load_config
from rlpost.controller.reward_checks import check_reward_values
from rlpost.controller.setup import check_positions
from rlpost.data.dataset import PromptRow, load_prompts
from rlpost.rewards import RewardInput, get_reward_fn
from rlpost.rewards.pool import RewardPool
from rlpost.tiny.model import build_char_tokenizer

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------------------------------------ the numbers
def test_an_integer_ground_truth_written_as_a_float_is_the_integer(tmp_path):
    """pandas writes an integer column with a missing value as floats: 123.0 must score "123"."""
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "1+1=", "ground_truth": 123.0}, {"prompt": "1+2=", "ground_truth": 0.5}]
    rows += [{"prompt": "1+3=", "ground_truth": np.int64(7).item()}, {"prompt": "1+4=", "ground_truth": 12}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_prompts([str(path)], build_char_tokenizer(), 64)
    assert [r.ground_truth for r in loaded.rows] == ["123", "0.5", "7", "12"]
    assert get_reward_fn("arithmetic")(RewardInput("", "123", loaded.rows[0].ground_truth, "")) == 1.0


def test_a_ground_truth_that_is_no_finite_number_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1=", "ground_truth": NaN}\n')
    with pytest.raises(ValueError, match=r"d.jsonl: row 0: field 'ground_truth' is nan, not a number to score"):
        load_prompts([str(path)], build_char_tokenizer(), 64)


@pytest.mark.parametrize("truth", ["18", "18.0", "18.00", "1,8"[0:1] + "8"])
def test_gsm8k_compares_numbers(truth):
    assert get_reward_fn("gsm8k")(RewardInput("", "so #### 18", truth, "gsm8k")) == 1.0
    assert get_reward_fn("gsm8k")(RewardInput("", "so #### 18.5", truth, "gsm8k")) == 0.0


NUMERIC = """
import numpy as np, torch

def f(sample):
    return {"np32": np.float32(1.0), "np64": np.float64(0.5), "int": np.int64(1), "arr": np.array([0.25]),
            "tensor": torch.tensor(0.75), "none": None}[sample.response]
"""


@pytest.fixture(scope="module")
def numeric_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("r") / "n.py"
    path.write_text(NUMERIC)
    return f"{path}:f"


def test_numpy_and_torch_scalars_are_numbers(numeric_file):
    pool = RewardPool(numeric_file, {}, 1, timeout_s=20, memory_mb=0, error_score=-1.0)
    try:
        kinds = ["np32", "np64", "int", "arr", "tensor"]
        out = pool.score([RewardInput("", k, "", "") for k in kinds])
    finally:
        pool.close()
    assert out.scores == [1.0, 0.5, 1.0, 0.25, 0.75] and out.counts["errors"] == 0


def test_a_reward_that_returns_none_stops_the_run_before_any_actor_starts(numeric_file):
    cfg = load_config(["+recipe=quickstart", f"reward.fn={numeric_file}"])
    with pytest.raises(ConfigError) as info:  # the check's sample: the first row, its ground truth "none"
        check_reward_values(cfg, [PromptRow([1], "2+2=", "none", "arithmetic")])
    assert str(info.value) == (
        f"reward.fn={numeric_file!r} on a first try (a training row, its ground truth 'none' as the response): "
        "returned None (NoneType), not a finite number\n"
        "A reward function must return a number (int, float, a numpy or torch scalar)"
    )
    said = []
    check_reward_values(cfg, [PromptRow([1], "2+2=", "np32", "arithmetic")], said.append)  # a number: no error
    assert said == []
    check_reward_values(cfg, [PromptRow([1], "2+2=", "oops", "arithmetic")], said.append)  # raises: said, goes on
    assert len(said) == 1 and said[0].startswith(f"warning: reward.fn={numeric_file!r} on a first try")
    assert said[0].endswith("failed: KeyError: 'oops'; such samples score reward.error_score")


def test_a_reward_file_with_a_syntax_error_is_named_before_any_actor_starts(tmp_path):
    (tmp_path / "bad.py").write_text("def f(sample):\n    return 1 +\n")
    cfg = load_config(["+recipe=quickstart", f"reward.fn={tmp_path}/bad.py:f"])
    with pytest.raises(ConfigError) as info:
        check_reward_values(cfg, [PromptRow([1], "2+2=", "4", "arithmetic")])
    assert str(info.value).startswith(f"reward.fn='{tmp_path}/bad.py:f' could not be loaded: ValueError: ")
    assert str(info.value).endswith(f"{tmp_path}/bad.py line 2: SyntaxError: invalid syntax")


# -------------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["reward.error_score=nan"], "reward.error_score=nan must be a finite number"),
        (["reward.rule_weight=inf"], "reward.rule_weight=inf must be a finite number"),
        (["rollout.n=1"], r"algo.name=grpo needs rollout.n >= 2 \(got 1\): it scores each sample against"),
    ],
)
def test_settings_that_trained_on_nothing(overrides, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        load_config(["+recipe=quickstart", *overrides])


def test_lengths_beyond_the_models_positions_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    cfg = load_config(["+recipe=quickstart", "data.max_prompt_length=60", "rollout.max_response_length=8"])
    with pytest.raises(ConfigError) as info:
        check_positions(cfg, str(tmp_path))
    assert str(info.value) == (
        f"data.max_prompt_length=60 + rollout.max_response_length=8 = 68 tokens, more than the 64 positions of "
        f"the model ({tmp_path}, max_position_embeddings): lower one of them"
    )
    cfg = load_config(["+recipe=quickstart", "data.max_prompt_length=56", "rollout.max_response_length=8"])
    check_positions(cfg, str(tmp_path))


def test_a_tensor_score_is_not_mistaken_for_a_list():
    from rlpost.rewards.values import BadValue, checked

    assert checked(torch.tensor([2.0])) == 2.0
    with pytest.raises(BadValue, match=r"not a finite number"):
        checked(np.array([1.0, 2.0]))


def test_a_score_too_large_for_float32_losses_is_a_bad_value():
    """The fourteenth catalogue's t02: 1e39 (finite in Python, inf in float32) skipped every optimizer
    step and the run exited 0; the first try of the reward refuses it now, as it does a nan."""
    from rlpost.rewards.values import BadValue, checked

    assert checked(-1e19) == -1e19 and checked(np.float64(1e19)) == 1e19
    for big in (1e39, -2e19, np.float64(1.5e19)):
        with pytest.raises(BadValue, match=r"^returned [-0-9.e+]+, beyond \+-1e\+19: rewards are computed in float32"):
            checked(big)


def test_metrics_jsonl_is_written_whatever_the_backends_say(tmp_path):
    """Without `jsonl` in logger.backends a run's summary said "0 steps": it reads metrics.jsonl."""
    from rlpost.metrics.summary import read_metrics
    from rlpost.metrics.trackers import Trackers

    trackers = Trackers(["console"], tmp_path, write=lambda *_: None)
    trackers.log({"reward/mean": 0.5}, 1)
    trackers.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
