"""Advantage estimators: one registered function per estimator, all pure and on the CPU.

A registered estimator takes the batch (`rewards` [N], `group_ids` [N]: samples drawn for the same
prompt share a group id; the masks; the critic's `values` and per-token `token_rewards` [N, R] for
those that read them) and the `algo` config, and returns one advantage per sequence `[N]` (the
trainer broadcasts it over the response tokens) or one per token `[N, R]`; an estimator with a
critic returns `(advantages, returns)`, the returns being the critic's targets. The math of each
lives in a plain function of tensors, tested on its own.

- `grpo` (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean(r_group)) / (std(r_group) + eps),
  with the unbiased (n-1) standard deviation. With `norm_by_std=False` it is Dr.GRPO
  (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean(r_group).
  A group of one sample has advantage 0: there is nothing to compare it with.
- `rloo` (Ahmadian et al. 2024): A_i = r_i - mean of the other samples of its group
  (= n/(n-1) * (r_i - mean)); a group of one sample has advantage 0.
- `reinforce_pp` (Hu 2025, REINFORCE++): per-token rewards `token_rewards [N, R]` (the sequence's
  reward on its last token, and with the KL in the reward -kl_coef * KL_t on every token), returns
  G_t = sum_{s >= t} gamma^(s-t) r_s, then normalised over every loss token of the whole batch:
  A = (G - mean(G)) / (std(G) + eps). No critic, no groups.
- `gae` (Schulman et al. 2016; PPO with a critic): per loss token, with the critic's values V_t
  (`values` [N, R]: the value of the state before token t) and per-token rewards,
  delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lambda A_{t+1} (0 after the last
  token: the episode ends), returns G_t = A_t + V_t (the critic's targets); the advantages are
  then whitened over every loss token of the batch (mean 0, std 1), the returns are not.
- `reinforce_pp_baseline` (Hu 2025): the group mean as baseline, A_i = r_i - mean(r_group), then
  the same normalisation over every loss token of the batch (global, not per group).
"""

from __future__ import annotations

from typing import Callable

import torch

from rlpost.data.batch import Batch
from rlpost.registry import Registry

AdvantageFn = Callable[[Batch, object], torch.Tensor]
# registered with `token_rewards=True`: the estimator reads `batch["token_rewards"]` [N, R] (the
# sequence reward on its last loss token, and a KL penalty in the reward), which the controller
# then provides
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator", key="Algorithm.advantage")
TOKEN_REWARDS: set[str] = ADVANTAGES.flagged("token_rewards")  # the estimators that read per-token rewards


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


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over the tokens of `mask` [N, R] (a token outside the mask
    passes the return on unchanged and gets 0)."""
    out = torch.zeros_like(token_rewards, dtype=torch.float64)
    running = torch.zeros(token_rewards.shape[0], dtype=torch.float64)
    m = mask.bool()
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(m[:, t], token_rewards[:, t].double() + gamma * running, running)
        out[:, t] = torch.where(m[:, t], running, torch.zeros_like(running))
    return out


def gae_advantage(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) [N, R] of generalised advantage estimation over the tokens of `mask`
    (a token outside it, e.g. an environment's, is not a step: skipped, not discounted)."""
    adv = torch.zeros_like(token_rewards, dtype=torch.float64)
    next_value = torch.zeros(token_rewards.shape[0], dtype=torch.float64)
    next_adv = torch.zeros_like(next_value)
    m = mask.bool()
    for t in reversed(range(token_rewards.shape[1])):
        value = values[:, t].double()
        delta = token_rewards[:, t].double() + gamma * next_value - value
        a = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(m[:, t], a, torch.zeros_like(a))
        next_adv = torch.where(m[:, t], a, next_adv)
        next_value = torch.where(m[:, t], value, next_value)
    returns = torch.where(m, adv + values.double(), torch.zeros_like(adv))
    return adv, returns


def normalize_over_tokens(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(values - mean) / (std + eps) over the tokens of `mask` [N, R] (unbiased std), 0 elsewhere."""
    m = mask.bool()
    picked = values[m].double()
    if picked.numel() < 2:
        return torch.zeros_like(values, dtype=torch.float32)
    out = (values.double() - picked.mean()) / (picked.std() + eps)
    return torch.where(m, out, torch.zeros_like(out)).float()


@ADVANTAGES.register("grpo")
def grpo(batch: Batch, algo) -> torch.Tensor:
    return grpo_advantage(batch["rewards"], batch["group_ids"], norm_by_std=algo.norm_adv_by_std)


@ADVANTAGES.register("rloo")
def rloo(batch: Batch, algo) -> torch.Tensor:
    return rloo_advantage(batch["rewards"], batch["group_ids"], norm_by_std=algo.norm_adv_by_std)


@ADVANTAGES.register("reinforce_pp", token_rewards=True)
def reinforce_pp(batch: Batch, algo) -> torch.Tensor:
    returns = discounted_returns(batch["token_rewards"], batch["loss_mask"], algo.gamma)
    return normalize_over_tokens(returns, batch["loss_mask"])


@ADVANTAGES.register("gae", token_rewards=True)
def gae(batch: Batch, algo) -> tuple[torch.Tensor, torch.Tensor]:
    adv, returns = gae_advantage(batch["token_rewards"], batch["values"], batch["loss_mask"], algo.gamma, algo.lam)
    return normalize_over_tokens(adv, batch["loss_mask"]), returns.float()


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline(batch: Batch, algo) -> torch.Tensor:
    adv = grpo_advantage(batch["rewards"], batch["group_ids"], norm_by_std=False)
    return normalize_over_tokens(adv[:, None].expand_as(batch["loss_mask"]), batch["loss_mask"])
