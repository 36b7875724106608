import pytest

from rlpost.rewards import REWARDS, RewardInput, get_reward_fn, score_samples
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


def test_auto_routes_by_data_source_and_counts_unknown_sources():
    result = score_samples([sample("7", "7"), sample("#### 7", "7", "gsm8k"), sample("7", "7", "mystery")], None)
    assert result.scores == [1.0, 1.0, 0.0]
    assert result.errors == 1 and "mystery" in result.first_error


def test_user_function_from_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def length_bonus(sample):\n    return len(sample.response)\n"
        "def broken(sample):\n    if sample.response == 'x':\n        raise RuntimeError('boom')\n    return 1.0\n"
        "def not_a_number(sample):\n    return float('nan')\n"
    )
    fn = get_reward_fn(f"{path}:length_bonus")
    assert score_samples([sample("abc", "")], fn).scores == [3.0]
    # a raising function scores 0 for that sample and is counted; others are unaffected
    result = score_samples([sample("x", ""), sample("y", "")], get_reward_fn(f"{path}:broken"))
    assert result.scores == [0.0, 1.0] and result.errors == 1 and result.error_rows == [0]
    assert "boom" in result.first_error
    assert score_samples([sample("y", "")], get_reward_fn(f"{path}:not_a_number")).errors == 1


def test_bad_reward_specs_name_the_problem(tmp_path):
    with pytest.raises(KeyError, match="arithmetic"):
        get_reward_fn("nope")
    with pytest.raises(FileNotFoundError, match="no file"):
        get_reward_fn(str(tmp_path / "missing.py") + ":f")
    (tmp_path / "r.py").write_text("x = 1\n")
    with pytest.raises(AttributeError, match="no function 'f'"):
        get_reward_fn(f"{tmp_path / 'r.py'}:f")
