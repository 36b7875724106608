import pytest

from rlpost.rewards import REWARDS, RewardInput, get_reward_fn
from rlpost.rewards.builtin import extract_gsm8k_answer


def sample(response, gt, source="arithmetic"):
    return RewardInput(prompt="p", response=response, ground_truth=gt, data_source=source)


def test_arithmetic_exact_match():
    fn = REWARDS["arithmetic"]
    assert fn(sample(" 68", "68")) == 1.0
    assert fn(sample("68 ", "68")) == 1.0
    assert fn(sample("6 8", "68")) == 0.0
    assert fn(sample("680", "68")) == 0.0


@pytest.mark.parametrize(
    "response, strict, flexible",
    [
        ("so 3 + 4 = 7\n#### 7", "7", "7"),
        ("#### 1,234.", "1234", "1234"),
        ("the answer is 42.", None, "42"),
        ("#### 5 but actually 6", "5", "6"),
        ("no numbers", None, None),
        ("#### -3", "-3", "-3"),
    ],
)
def test_gsm8k_extraction(response, strict, flexible):
    assert extract_gsm8k_answer(response, "strict") == strict
    assert extract_gsm8k_answer(response, "flexible") == flexible


def test_gsm8k_scoring_modes():
    s = sample("I think it is 18", "18", "gsm8k")
    assert REWARDS["gsm8k"](s) == 0.0
    assert REWARDS["gsm8k"](s, method="flexible") == 1.0
    assert REWARDS["gsm8k"](sample("#### 18", "18", "gsm8k")) == 1.0


def test_bad_reward_specs_name_the_problem(tmp_path):
    with pytest.raises(KeyError, match="arithmetic"):
        get_reward_fn("nope")
    with pytest.raises(FileNotFoundError, match="no file"):
        get_reward_fn(str(tmp_path / "missing.py") + ":f")
    (tmp_path / "r.py").write_text("x = 1\n")
    with pytest.raises(AttributeError, match="no function 'f'"):
        get_reward_fn(f"{tmp_path / 'r.py'}:f")
