"""Issue 43: one scorer for rlpost, TRL and verl: rlpost's own registered scorer, named by the row's
`data_source` (`last_number` for smollm2_sums: the response's last number equals the sum), called
on the response text decoded as rlpost decodes it (`skip_special_tokens=True`, the eos dropped).

- verl 0.9.1: `reward.custom_reward_function.path=benchmarks/peers/sums_reward.py`
  `reward.custom_reward_function.name=compute_score`. Its naive reward manager decodes the valid
  response ids with `skip_special_tokens=True` and calls
  `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`; a float return is
  logged as both the reward and `acc` (`val-core/<data_source>/acc/mean@1`).
- TRL 1.16.0: `reward_funcs=trl_reward(tokenizer)`. GRPOTrainer calls it with `prompts`,
  `completions`, `completion_ids` and the dataset's columns (`ground_truth`, `data_source`) as
  keyword arguments; it decodes `completion_ids` itself, so TRL's own parsing of the completion
  (message dicts) plays no part.

verl loads this file by path in its reward workers, so it puts the repository on `sys.path`
itself. `STATS` counts what TRL's reward calls saw (completion tokens, rewards) for its logger.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from rlpost.rewards import REWARDS, RewardInput  # noqa: E402  (after the path above)

STATS: dict[str, float] = {"completion_tokens": 0.0, "completions": 0.0, "reward_sum": 0.0}


def score(response: str, ground_truth, data_source: str = "last_number", prompt: str = "") -> float:
    """rlpost's scorer of `data_source` on one response (what `reward.fn=auto` scores it with)."""
    sample = RewardInput(prompt, response, str(ground_truth), data_source)
    return float(REWARDS.get(data_source)(sample))


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl's custom reward function."""
    return score(solution_str, ground_truth, data_source)


def trl_reward(tokenizer):
    """TRL's reward function: `completion_ids` decoded as rlpost decodes responses, then `score`."""

    def sums_reward(prompts, completions, completion_ids, ground_truth, data_source, **kwargs) -> list[float]:
        texts = tokenizer.batch_decode([list(ids) for ids in completion_ids], skip_special_tokens=True)
        rewards = [score(t, g, s) for t, g, s in zip(texts, ground_truth, data_source)]
        STATS["completion_tokens"] += sum(len(ids) for ids in completion_ids)
        STATS["completions"] += len(rewards)
        STATS["reward_sum"] += sum(rewards)
        return rewards

    return sums_reward
