"""Rewards: a typed protocol, a registry of named scorers, and user functions loaded from files.

A reward function takes one `RewardInput` and returns a float. `reward.fn` picks it:
`auto` (the registered scorer named by each row's `data_source`), a registered name
(`arithmetic`, `gsm8k`, ...), or `path/to/file.py:function` for user code.
A function that raises, or returns something that is not a finite number, scores 0 for that
sample; the controller counts it in `reward/errors` and logs the first message of each step.
"""

from rlpost.rewards import builtin  # noqa: F401  (registers the built-in scorers)
from rlpost.rewards.base import (
    REWARDS,
    RewardFn,
    RewardInput,
    RewardResult,
    get_reward_fn,
    register_reward,
    score_samples,
)

__all__ = ["REWARDS", "RewardFn", "RewardInput", "RewardResult", "get_reward_fn", "register_reward", "score_samples"]
