"""Built-in rule-based scorers.

- `arithmetic`: 1.0 if the response, stripped of surrounding whitespace, is exactly the integer
  answer, else 0.0.
- `gsm8k`: the answer after the last `#### ` (strict, the GSM8K reference format, as in
  lm-eval-harness' strict-match), or with `method="flexible"` the last number in the response
  (flexible-extract). Commas and a trailing period are ignored; 1.0 if it equals the ground truth.

Both are trusted (scored in the controller's process): a strip and a comparison, or two regular
expressions without nested repetition, so their time is linear in the response's length.
"""

from __future__ import annotations

import re

from rlpost.rewards.base import RewardInput, register_reward

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_RUN = re.compile(r"-?[0-9.,]+")  # a run of number characters; no backtracking, so linear time


def _normalise_number(text: str) -> str:
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


@register_reward("arithmetic", trusted=True)
def arithmetic(sample: RewardInput) -> float:
    return 1.0 if sample.response.strip() == sample.ground_truth.strip() else 0.0


def extract_gsm8k_answer(response: str, method: str = "strict") -> str | None:
    if method == "strict":
        found = _STRICT.findall(response)
    elif method == "flexible":  # the last run that holds a digit, up to that digit: the last
        for run in reversed(_RUN.findall(response)):  # match of `-?[0-9.,]*[0-9]+`, in linear time
            run = run.rstrip(".,")
            if run[-1:].isdigit():
                return _normalise_number(run)
        return None
    else:
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    return _normalise_number(found[-1]) if found else None


@register_reward("gsm8k", trusted=True)
def gsm8k(sample: RewardInput, method: str = "strict") -> float:
    answer = extract_gsm8k_answer(sample.response, method)
    return 1.0 if answer is not None and answer == _normalise_number(sample.ground_truth) else 0.0
