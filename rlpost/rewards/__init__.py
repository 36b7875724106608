"""Rewards: a typed protocol, a registry of named scorers, and user functions loaded from files.

A reward function takes one `RewardInput` and returns a float. `reward.fn` picks it:
`auto` (the registered scorer named by each row's `data_source`), a registered name
(`arithmetic`, `gsm8k`, `last_number`, `answer_line`: `rewards/builtin.py`; `reasoning_gym`,
`math_verify`: `rewards/library.py`), or `path/to/file.py:function` for user code.
Scoring runs in worker processes (`rlpost.rewards.pool.RewardPool`): a sample whose function
raises, returns something that is not a finite number, times out or crashes its worker scores
`reward.error_score` and is counted by kind (`reward/errors`, `reward/timeouts`, ...).
"""

from rlpost.rewards import builtin, library  # noqa: F401  (register the built-in and the libraries' scorers)
from rlpost.rewards.base import REWARDS, RewardFn, RewardInput, get_reward_fn

__all__ = ["REWARDS", "RewardFn", "RewardInput", "get_reward_fn"]
