"""Policy losses, KL estimators, entropy and loss aggregation: pure functions on `[B, R]` tensors.

All per-token inputs are in the response layout (`[B, R]`, right-padded) with `mask` marking real
response tokens; padded positions never contribute.

- PPO clipped surrogate (Schulman et al. 2017) with dual clip (Ye et al. 2020, "Mastering Complex
  Control in MOBA Games"): ratio r = exp(logp - old_logp);
  per-token loss = max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), and for A < 0 it is further
  capped at -A * c (c = `clip_ratio_c` > 1), so a huge ratio on a bad action cannot blow up.
- KL estimators against the reference policy (Schulman 2020, "Approximating KL Divergence"),
  with d = logp - ref_logp: k1 = d, k2 = d^2 / 2, k3 = exp(-d) - 1 + d (unbiased, >= 0).
- Entropy of the full next-token distribution at each response position, from the logits.
- Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly
  brings you off-policy RL training"): the sampler (vLLM, or an older weight version under
  one-step-off-policy) is not the policy the trainer scores. Each token's loss is weighted by
  w = min(pi_old / pi_rollout, C) (`token`), or every token of a sequence by
  min(prod_t pi_old / pi_rollout, C) (`sequence`); w carries no gradient.
- Clipped value loss (PPO's critic): 0.5 * max((V - G)^2, (V_old + clip(V - V_old, -c, c) - G)^2)
  with the returns G as targets, so the values move at most c from those of the rollout.
- Aggregation: `token-mean` averages over every real token of the batch (DAPO, Yu et al. 2025);
  `seq-mean-token-mean` averages tokens within each sequence, then sequences (the original GRPO);
  `seq-mean-token-sum-norm` sums each sequence's tokens and divides by a constant, the generation
  budget `norm_length` (`rollout.max_response_length`), then averages sequences (Dr.GRPO, Liu et
  al. 2025: no length bias). `denominator` lets a data-parallel caller divide by the global count
  (tokens, or sequences with at least one token) instead of the local one.
"""

from __future__ import annotations

import math

import torch

from rlpost.registry import Registry

# the aggregations (`algo.loss_agg_mode`) and KL estimators (`algo.kl_estimator`), registered below
LOSS_AGG_MODES = Registry("loss aggregation", key="algo.loss_agg_mode")
KL_ESTIMATORS = Registry("KL estimator", key="algo.kl_estimator")


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


def aggregate(
    loss: torch.Tensor, mask: torch.Tensor, mode: str, denominator: float | None = None, norm_length: int = 0
) -> torch.Tensor:
    """Reduce a per-token `[B, R]` loss to a scalar by the aggregation `mode` (`LOSS_AGG_MODES`).

    `denominator`: the number of tokens (token-mean) or sequences (seq-mean-token-mean) to divide
    by; by default those of this batch. Passing the global count makes micro-batches and ranks add
    up to the exact full-batch mean. A tensor stays on its device (no host sync).
    """
    mask = mask.to(loss.dtype)
    return LOSS_AGG_MODES.get(mode)(loss, mask, denominator, norm_length)


def token_mean(loss: torch.Tensor, mask: torch.Tensor, denominator, norm_length: int) -> torch.Tensor:
    denom = mask.sum() if denominator is None else denominator
    return masked_sum(loss, mask) / _at_least_one(denom, loss)


def seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, denominator, norm_length: int) -> torch.Tensor:
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return _over_sequences(per_seq, loss, mask, denominator)


def seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, denominator, norm_length: int) -> torch.Tensor:
    if norm_length < 1:
        raise ValueError("loss aggregation seq-mean-token-sum-norm needs norm_length >= 1 (the generation budget)")
    per_seq = (loss * mask).sum(-1) / norm_length
    return _over_sequences(per_seq, loss, mask, denominator)


def _over_sequences(per_seq: torch.Tensor, loss: torch.Tensor, mask: torch.Tensor, denominator) -> torch.Tensor:
    """The mean of `per_seq` [B] over the sequences with at least one token (or `denominator`)."""
    has_tokens = (mask.sum(-1) > 0).to(loss.dtype)
    denom = has_tokens.sum() if denominator is None else denominator
    return (per_seq * has_tokens).sum() / _at_least_one(denom, loss)


# registered by a call, not a decorator: mutation testing (benchmarks/mutation/mutation.py) skips decorated functions
LOSS_AGG_MODES.register("token-mean", token_mean)
LOSS_AGG_MODES.register("seq-mean-token-mean", seq_mean_token_mean)
LOSS_AGG_MODES.register("seq-mean-token-sum-norm", seq_mean_token_sum_norm)


def _at_least_one(count, like: torch.Tensor):
    if isinstance(count, torch.Tensor):
        return count.to(like.dtype).clamp(min=1.0)
    return max(float(count), 1.0)


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_c: float,
):
    """Per-token PPO dual-clip loss `[B, R]`, the ratio `[B, R]` and where clipping was active.

    `advantages` is `[B, R]` (or `[B, 1]`, broadcast over tokens).
    """
    if clip_c <= 1.0:
        raise ValueError(f"algo.clip_ratio_c must be > 1, got {clip_c}")
    ratio = torch.exp(logp - old_logp)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    dual = torch.minimum(loss, -advantages * clip_c)
    loss = torch.where(advantages < 0, dual, loss)
    return loss, ratio, clipped


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log of GSPO's sequence ratio (pi(y) / pi_old(y))^(1/|y|), `[B, 1]`: the mean of the token
    log-ratios over the tokens of `mask` (0 for a row without one)."""
    mask = mask.to(logp.dtype)
    return ((logp - old_logp) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)


def truncated_is_weights(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, mode: str, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights of the sampler/trainer mismatch `[B, R]` (no gradient) and where they
    were cut. `token` / `sequence`: the token's ratio (or the sequence's product) truncated at
    `threshold` (TIS); `token_mask` / `sequence_mask`: 1 where the ratio lies within [1 /
    threshold, threshold], else 0: the token (IcePop) or the whole sequence (MIS) leaves the loss."""
    diff = ((old_logp - rollout_logp) * mask).detach()
    if mode in ("token", "token_mask"):
        log_w = diff
    elif mode in ("sequence", "sequence_mask"):
        log_w = diff.sum(-1, keepdim=True).expand_as(diff)
    else:
        raise ValueError(f"algo.rollout_is={mode!r}; choose none, token, sequence, token_mask or sequence_mask")
    log_cap = math.log(threshold)
    if mode.endswith("_mask"):
        outside = log_w.abs() > log_cap
        return (~outside).to(diff.dtype), outside
    truncated = log_w > log_cap
    return torch.exp(log_w.clamp(max=log_cap)), truncated


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss per token `[B, R]` and where the clipped term was the larger:
    0.5 * max((V - G)^2, (V_old + clip(V - V_old, -c, c) - G)^2)."""
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    unclipped, clipped = (values - returns).square(), (clipped_values - returns).square()
    return 0.5 * torch.maximum(unclipped, clipped), clipped > unclipped


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) `[B, R]` by `estimator` (`KL_ESTIMATORS`)."""
    return KL_ESTIMATORS.get(estimator)(logp - ref_logp)


def kl_k1(d: torch.Tensor) -> torch.Tensor:
    return d


def kl_k2(d: torch.Tensor) -> torch.Tensor:
    return 0.5 * d.square()


def kl_k3(d: torch.Tensor) -> torch.Tensor:
    # clamp as in common practice: exp of a large negative d would overflow the estimate
    return torch.exp(-d.clamp(min=-20.0, max=20.0)) - 1.0 + d


KL_ESTIMATORS.register("k1", kl_k1)
KL_ESTIMATORS.register("k2", kl_k2)
KL_ESTIMATORS.register("k3", kl_k3)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: logsumexp(z) - sum(p * z)."""
    logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)
