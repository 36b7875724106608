"""Policy losses: pure functions from typed per-token inputs to one micro-batch's loss and metrics.

The actor runs the forward pass of a micro-batch, packs what it computed into `LossInputs` and
calls the loss the algorithm names (`algo.policy_loss`, one of `POLICY_LOSSES`); it knows no
algorithm. A loss sees no ranks or micro-batches beyond `denominator`: the token (or sequence)
count of the whole mini-batch over every data-parallel rank, so that micro-batches and ranks add
up to the mini-batch loss (`rlpost.algos.losses.aggregate`).

Every loss is its policy-gradient term per token, weighted by truncated importance weights
pi_old / pi_rollout when `algo.rollout_is` is set (TIS, Yao et al. 2025), plus `kl_coef` x
KL(pi || pi_ref) by the chosen estimator when the algorithm puts the KL in the loss, minus
`entropy_coef` x entropy, each aggregated by `algo.loss_agg_mode` over the tokens of `loss_mask`:

- `ppo`: the PPO dual-clip surrogate of Schulman et al. 2017 / Ye et al. 2020 on the ratio
  pi / pi_old per token.
- `gspo`: the sequence-level ratio and clip of GSPO (Zheng et al. 2025).
- `cispo`: the clipped, stop-gradient importance weight of CISPO (MiniMax 2025).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch

from rlpost.algos.losses import aggregate, kl_penalty, ppo_clip_loss, sequence_log_ratio, truncated_is_weights
from rlpost.registry import Registry


@dataclass
class LossInputs:
    """One micro-batch, every per-token tensor `[b, R]` in the response layout."""

    logp: torch.Tensor  # current policy log-probs (carry the gradient)
    old_logp: torch.Tensor  # the policy that the ratio is taken against (no gradient)
    advantages: torch.Tensor  # [b, 1] (one per sequence) or [b, R]
    loss_mask: torch.Tensor  # float: 1 on tokens that get a loss (the model's own tokens)
    denominator: float  # tokens (token-mean) or sequences of the mini-batch over every rank
    norm_length: int = 0  # Dr.GRPO's constant: rollout.max_response_length
    entropy: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None  # needed when kl_coef > 0
    rollout_logp: torch.Tensor | None = None  # needed when rollout_is != none
    kl_coef: float = 0.0  # the KL term's weight: algo.kl_coef when the algorithm puts the KL in the loss


@dataclass
class LossOutputs:
    """The loss (a scalar with a graph) and metrics, as 0-d tensors on the loss's device (no host
    sync here): `means` as (sum, count) pairs over the tokens of `loss_mask`, reduced over
    micro-batches and ranks by the caller; `maxes` and `mins` (-inf / +inf where no token)."""

    loss: torch.Tensor
    means: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    maxes: dict[str, torch.Tensor] = field(default_factory=dict)
    mins: dict[str, torch.Tensor] = field(default_factory=dict)


PolicyLoss = Callable[[LossInputs, object], LossOutputs]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", key="Algorithm.policy_loss")


def _masked(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (values.detach() * mask).sum(), mask.sum()


def _extreme(values: torch.Tensor, mask: torch.Tensor, largest: bool) -> torch.Tensor:
    """The max (or min) of `values` over the tokens of `mask`; -inf (+inf) where there is none."""
    fill = -math.inf if largest else math.inf
    masked = torch.where(mask.bool(), values.detach(), fill)
    return masked.max() if largest else masked.min()


def _terms(pg: torch.Tensor, ratio: torch.Tensor, clipped: torch.Tensor, x: LossInputs, algo) -> LossOutputs:
    """What every policy loss shares, around its per-token policy-gradient term `pg`: the TIS
    weights multiplied in, aggregation, the KL term (`x.kl_coef`, when the KL is in the loss) and
    the entropy bonus, and the metrics."""
    mask = x.loss_mask
    agg = partial(aggregate, mask=mask, mode=algo.loss_agg_mode, denominator=x.denominator, norm_length=x.norm_length)
    out = LossOutputs(loss=torch.zeros(()))
    if algo.rollout_is != "none":  # the sampler is not the policy scored here: reweight (TIS)
        weights, truncated = truncated_is_weights(
            x.old_logp, x.rollout_logp, mask, algo.rollout_is, algo.rollout_is_threshold
        )
        pg = pg * weights
        out.means["rollout_corr/is_weight_mean"] = _masked(weights, mask)
        out.means["rollout_corr/truncated_frac"] = _masked(truncated.float(), mask)
        out.maxes["rollout_corr/is_weight_max"] = _extreme(weights, mask, largest=True)
        out.means["rollout_corr/kl"] = _masked(kl_penalty(x.rollout_logp, x.old_logp, "k3"), mask)
    loss = agg(pg)
    if x.kl_coef > 0:
        kl = kl_penalty(x.logp, x.ref_logp, algo.kl_estimator)  # KL(policy || reference), per token
        loss = loss + x.kl_coef * agg(kl)
        out.means["actor/kl"] = _masked(kl, mask)
    if algo.entropy_coef:
        loss = loss - algo.entropy_coef * agg(x.entropy)
    out.loss = loss
    out.means["actor/pg_loss"] = _masked(pg, mask)
    out.means["actor/pg_clipfrac"] = _masked(clipped.float(), mask)
    if x.entropy is not None:
        out.means["actor/entropy"] = _masked(x.entropy, mask)
    # every rank reports every key (a collective reduce): an empty micro-batch gives -inf / +inf
    out.maxes["actor/ppo_ratio_max"] = _extreme(ratio, mask, largest=True)
    out.mins["actor/ppo_ratio_min"] = _extreme(ratio, mask, largest=False)
    return out


def ppo_loss(x: LossInputs, algo) -> LossOutputs:
    pg, ratio, clipped = ppo_clip_loss(
        x.logp, x.old_logp, x.advantages, algo.clip_ratio_low, algo.clip_ratio_high, algo.clip_ratio_c
    )
    return _terms(pg, ratio, clipped, x, algo)


def gspo_loss(x: LossInputs, algo) -> LossOutputs:
    """GSPO (Zheng et al. 2025): the sequence's importance ratio s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|)
    (the geometric mean of its token ratios over the loss tokens), clipped per sequence, in the
    paper's GSPO-token form s_i,t = sg[s_i] * pi_t / sg[pi_t]: each token carries the value s_i
    and the gradient of log pi_t / |y_i|, so with `seq-mean-token-mean` (the paper's) the loss is
    -1/G sum_i min(s_i A_i, clip(s_i, 1 - clip_ratio_low, 1 + clip_ratio_high) A_i)."""
    seq_ratio = sequence_log_ratio(x.logp, x.old_logp, x.loss_mask)
    ratio = torch.exp(seq_ratio.detach() + x.logp - x.logp.detach())
    loss_unclipped = -x.advantages * ratio
    loss_clipped = -x.advantages * torch.clamp(ratio, 1.0 - algo.clip_ratio_low, 1.0 + algo.clip_ratio_high)
    return _terms(torch.maximum(loss_unclipped, loss_clipped), ratio, loss_clipped > loss_unclipped, x, algo)


def cispo_loss(x: LossInputs, algo) -> LossOutputs:
    """CISPO (MiniMax 2025, MiniMax-M1): REINFORCE with the importance weight clipped and
    stopped from the gradient, so no token's gradient is dropped (PPO's clip zeroes it):
    per-token loss -sg[min(r_t, 1 + clip_ratio_high)] A_t log pi_t. As in the paper the weight
    has no lower bound. At r = 1 its gradient is PPO's."""
    ratio = torch.exp(x.logp - x.old_logp)
    clipped = ratio > 1.0 + algo.clip_ratio_high
    weight = torch.clamp(ratio, max=1.0 + algo.clip_ratio_high).detach()
    return _terms(-x.advantages * weight * x.logp, ratio, clipped, x, algo)


# registered by a call, not a decorator: mutation testing (benchmarks/mutation/mutation.py) skips decorated functions
POLICY_LOSSES.register("ppo", ppo_loss)
POLICY_LOSSES.register("gspo", gspo_loss)
POLICY_LOSSES.register("cispo", cispo_loss)
