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


def test_flexible_extraction_finds_the_numbers_of_the_reference_pattern_in_linear_time():
    import random
    import re

    reference = re.compile(r"(\-?[0-9\.\,]*[0-9]+)")  # lm-eval-harness' flexible-extract: quadratic
    rng = random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choice("0123-.,a $9") for _ in range(rng.randint(0, 14)))
        found = reference.findall(text)
        assert extract_gsm8k_answer(text, "flexible") == (found[-1].replace(",", "").rstrip(".") if found else None)
    # 200k characters of dots: minutes for the reference pattern, a millisecond here
    assert extract_gsm8k_answer("." * 200_000 + " 5", "flexible") == "5"


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
