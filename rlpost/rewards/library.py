"""Scorers from task libraries (`pip install -e '.[tasks]'`), imported when first called. Not
trusted: they run in the reward pool's processes (`reward.num_workers`), each sample under
`reward.timeout_s` and `reward.memory_mb`, since they import large libraries and some of their
checks are slow (sympy).

- `reasoning_gym`: the answer inside the response's last `<answer>...</answer>`
  (`reasoning_gym.utils.extract_answer`), or without tags its last non-empty line, scored by the
  dataset's own `score_answer(answer, entry)` (`reasoning_gym.get_score_answer_fn`); the row's
  ground truth is the JSON that `rlpost.data.gym_tasks` writes (dataset, answer, metadata).
  Scores are the dataset's, in [0, 1] (some give partial credit).
- `math_verify`: Hugging Face's math-verify. The gold answer is `parse` of the ground truth (a
  plain number or expression wrapped in `$...$` so that it parses as LaTeX), the prediction is
  `parse` of the response; 1.0 if `verify(gold, prediction)`, else 0.0. math-verify bounds
  its own parsing and comparison with `signal.alarm`, which would replace the pool worker's
  alarm handler and, when done, cancel the pool's timer (`alarm(0)`): a later sample of the same
  chunk would then run without a timeout. Its timeouts are turned off (`parsing_timeout=None`,
  `timeout_seconds=None`) and the pool's `reward.timeout_s` bounds the whole sample instead.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging

from rlpost.rewards.base import REWARDS, RewardInput

PACKAGES = {"reasoning_gym": "reasoning-gym>=0.1.25", "math_verify": "math-verify>=0.9"}


def require(module: str):
    """The module, or an ImportError naming the package and the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        root = module.split(".")[0]
        raise ImportError(
            f"reward {root!r} needs the {PACKAGES[root].split('>')[0]} package: "
            f"pip install '{PACKAGES[root]}' (or pip install -e '.[tasks]')"
        ) from e


@functools.lru_cache(maxsize=None)
def gym_scorer(dataset: str):
    """The dataset's `score_answer` (built once per worker: some datasets load files to build)."""
    return require("reasoning_gym").get_score_answer_fn(dataset)


def gym_answer(response: str) -> str:
    """The last `<answer>` tag's content, else the last non-empty line (stripped), else ""."""
    tagged = require("reasoning_gym.utils").extract_answer(response)
    if tagged is not None:
        return tagged
    lines = [line.strip() for line in response.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@REWARDS.register("reasoning_gym")
def reasoning_gym_score(sample: RewardInput) -> float:
    try:
        entry = json.loads(sample.ground_truth)
    except ValueError:
        entry = None
    if not (isinstance(entry, dict) and "dataset" in entry):  # (rows of another task: the seventeenth's t137)
        raise ValueError(
            f"ground truth {sample.ground_truth[:60]!r} is not a reasoning-gym entry (JSON with its 'dataset'), as "
            "rows made by data.task=reasoning_gym hold: score these rows with their own task's reward.fn (or auto)"
        )
    return float(gym_scorer(entry["dataset"])(gym_answer(sample.response), entry))


def gold_text(ground_truth: str) -> str:
    """The ground truth as math-verify's LaTeX extraction finds it: wrapped in `$...$` unless it is
    LaTeX already (holds a `$` or a `\\`)."""
    text = ground_truth.strip()
    return text if "$" in text or "\\" in text else f"${text}$"


@functools.lru_cache(maxsize=None)
def _math_verify():
    module = require("math_verify")
    # the warning that its own timeout is off, once per process: the pool's alarm is the timeout
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return module


@REWARDS.register("math_verify")
def math_verify_score(sample: RewardInput) -> float:
    mv = _math_verify()
    gold = mv.parse(gold_text(sample.ground_truth), parsing_timeout=None)
    prediction = mv.parse(sample.response, parsing_timeout=None)
    return 1.0 if mv.verify(gold, prediction, timeout_seconds=None) else 0.0
