"""Built-in rule-based scorers.

- `arithmetic`: 1.0 if the response, stripped of surrounding whitespace, is exactly the integer
  answer, else 0.0.
- `gsm8k`: the answer after the last `#### ` (strict, the GSM8K reference format, as in
  lm-eval-harness' strict-match), or with `method="flexible"` the last number in the response
  (flexible-extract). Commas and a trailing period are ignored; 1.0 if it equals the ground truth.
- `last_number` (task `sums_chat`): the last number in the response, found as gsm8k's flexible
  extraction finds it (commas removed, a trailing period stripped); 1.0 if it equals the ground
  truth as a number: both are read as exact decimals, so "068", "68.0" and "+68" all equal "68"
  (the value is what the task asks for), and integers compare exactly, however long.
- `answer_line` (task `sums_steps`): the first number after the last "Answer:" (any case) on
  that line, e.g. "Answer: 213" or "**Answer:** $1,234."; compared like `last_number`. No
  "Answer:", or no number after it on its line, scores 0.
- `running_total` (task `sums_steps`, where the steps must pay): the sum asked for in the prompt
  (its last "a + b + c ..." expression) worked out step by step: 1.0 if the response's numbers
  hold each running total (a + b, then + c, ...) in order and its last number is the sum, else 0.

All are trusted (scored in the controller's process): a strip and a comparison, or regular
expressions without nested repetition, so their time is linear in the response's length (the
numbers are compared as `Decimal`s, whose parsing is linear too, unlike `int`'s).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from rlpost.rewards.base import REWARDS, RewardInput

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_RUN = re.compile(r"-?[0-9.,]+")  # a run of number characters; no backtracking, so linear time
_ANSWER = re.compile(r"answer:", re.IGNORECASE)
_SUM = re.compile(r"\d+(?: ?\+ ?\d+)+")  # "5 + 7 + 2": no nested repetition that backtracks


def _normalise_number(text: str) -> str:
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


@REWARDS.register("arithmetic", trusted=True)
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


@REWARDS.register("gsm8k", trusted=True)
def gsm8k(sample: RewardInput, method: str = "strict") -> float:
    """1.0 if the answer is the ground truth: as numbers where both are ("18.00" is "18"), else as text."""
    answer = extract_gsm8k_answer(sample.response, method)
    if answer is None:
        return 0.0
    value, truth = as_decimal(answer), as_decimal(sample.ground_truth)
    if value is not None and truth is not None:
        return 1.0 if value == truth else 0.0
    return 1.0 if answer == _normalise_number(sample.ground_truth) else 0.0


def as_decimal(text: str) -> Decimal | None:
    """`text` as an exact number ("1,234." -> 1234), or None if it is not one."""
    try:
        value = Decimal(_normalise_number(text))
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def same_number(answer: str | None, ground_truth: str) -> float:
    """1.0 if `answer` is the number `ground_truth` is; a ground truth that is no number is an error."""
    truth = as_decimal(ground_truth)
    if truth is None:
        raise ValueError(f"ground truth {ground_truth!r} is not a number")
    value = None if answer is None else as_decimal(answer)
    return 1.0 if value is not None and value == truth else 0.0


@REWARDS.register("last_number", trusted=True)
def last_number(sample: RewardInput) -> float:
    return same_number(extract_gsm8k_answer(sample.response, "flexible"), sample.ground_truth)


def extract_answer_line(response: str) -> str | None:
    """The first number after the last "Answer:" (any case), on the same line; None if none."""
    last = None
    for last in _ANSWER.finditer(response):
        pass
    if last is None:
        return None
    end = response.find("\n", last.end())
    line = response[last.end() : end if end >= 0 else len(response)]
    for run in _RUN.finditer(line):
        if any(c.isdigit() for c in run.group()):
            return _normalise_number(run.group())
    return None


@REWARDS.register("answer_line", trusted=True)
def answer_line(sample: RewardInput) -> float:
    return same_number(extract_answer_line(sample.response), sample.ground_truth)


def numbers_in(text: str) -> list[Decimal]:
    """Every number of `text`, in order (runs of number characters that read as one)."""
    values = (as_decimal(run.rstrip(".,")) for run in _RUN.findall(text) if any(c.isdigit() for c in run))
    return [v for v in values if v is not None]


@REWARDS.register("running_total", trusted=True)
def running_total(sample: RewardInput) -> float:
    sums = _SUM.findall(sample.prompt)
    if not sums:
        raise ValueError(f"running_total: the prompt holds no sum 'a + b + ...' to check: {sample.prompt[-200:]!r}")
    operands = [Decimal(x) for x in re.findall(r"\d+", sums[-1])]
    totals = [sum(operands[: k + 1]) for k in range(1, len(operands))]
    found = numbers_in(sample.response)
    if not found or found[-1] != totals[-1] or same_number(str(totals[-1]), sample.ground_truth) != 1.0:
        return 0.0
    position = 0
    for total in totals:  # each running total, in order (the last one may be the answer itself)
        while position < len(found) and found[position] != total:
            position += 1
        if position == len(found):
            return 0.0
        position += 1
    return 1.0
