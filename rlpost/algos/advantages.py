"""Advantage estimators: one registered function per estimator, all pure and on the CPU.

A registered estimator takes the batch (`rewards` [N], `group_ids` [N]: samples drawn for the same
prompt share a group id; the masks; later values or token-level rewards) and the `algo` config, and
returns one advantage per sequence `[N]` (the trainer broadcasts it over the response tokens) or
one per token `[N, R]`. The math of each lives in a plain function of tensors, tested on its own.

- `grpo` (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean(r_group)) / (std(r_group) + eps),
  with the unbiased (n-1) standard deviation. With `norm_by_std=False` it is Dr.GRPO
  (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean(r_group).
  A group of one sample has advantage 0: there is nothing to compare it with.
- `rloo` (Ahmadian et al. 2024): A_i = r_i - mean of the other samples of its group
  (= n/(n-1) * (r_i - mean)); a group of one sample has advantage 0.
"""

from __future__ import annotations

from typing import Callable

import torch

from rlpost.data.batch import Batch

AdvantageFn = Callable[[Batch, object], torch.Tensor]
ADVANTAGES: dict[str, AdvantageFn] = {}


def register_advantage(name: str):
    def wrap(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ADVANTAGES[name] = fn
        return fn

    return wrap


def get_advantage(name: str) -> AdvantageFn:
    if name not in ADVANTAGES:
        raise KeyError(f"algo.advantage={name!r} is not registered; choose one of {sorted(ADVANTAGES)}")
    return ADVANTAGES[name]


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor):
    """Per-sample group mean, unbiased group std and group size, all [N] float64."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    r = rewards.double()
    sums = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, r)
    mean = (sums / counts)[inverse]
    sq = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, (r - mean) ** 2)
    dof = (counts - 1).clamp(min=1)
    std = (sq / dof).sqrt()[inverse]
    return mean, std, counts[inverse].double()


def grpo_advantage(
    rewards: torch.Tensor, group_ids: torch.Tensor, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    mean, std, size = _group_stats(rewards, group_ids)
    adv = rewards.double() - mean
    if norm_by_std:
        adv = adv / (std + eps)
    return torch.where(size > 1, adv, torch.zeros_like(adv)).float()


def rloo_advantage(
    rewards: torch.Tensor, group_ids: torch.Tensor, norm_by_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    mean, std, size = _group_stats(rewards, group_ids)
    adv = (rewards.double() - mean) * size / (size - 1).clamp(min=1)
    if norm_by_std:
        adv = adv / (std + eps)
    return torch.where(size > 1, adv, torch.zeros_like(adv)).float()


@register_advantage("grpo")
def grpo(batch: Batch, algo) -> torch.Tensor:
    return grpo_advantage(batch["rewards"], batch["group_ids"], norm_by_std=algo.norm_adv_by_std)


@register_advantage("rloo")
def rloo(batch: Batch, algo) -> torch.Tensor:
    return rloo_advantage(batch["rewards"], batch["group_ids"], norm_by_std=algo.norm_adv_by_std)
