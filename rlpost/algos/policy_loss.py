"""Policy losses: pure functions from typed per-token inputs to one micro-batch's loss and metrics.

The actor runs the forward pass of a micro-batch, packs what it computed into `LossInputs` and
calls the loss the algorithm names (`algo.policy_loss`, one of `POLICY_LOSSES`); it knows no
algorithm. A loss sees no ranks or micro-batches beyond `denominator`: the token (or sequence)
count of the whole mini-batch over every data-parallel rank, so that micro-batches and ranks add
up to the mini-batch loss (`rlpost.algos.losses.aggregate`).

- `ppo`: the PPO dual-clip surrogate of Schulman et al. 2017 / Ye et al. 2020 on the ratio
  pi / pi_old per token, weighted by truncated importance weights pi_old / pi_rollout when
  `algo.rollout_is` is set (TIS, Yao et al. 2025), plus `kl_coef` x KL(pi || pi_ref) by the
  chosen estimator and minus `entropy_coef` x entropy, each aggregated by `algo.loss_agg_mode`
  over the tokens of `loss_mask`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch

from rlpost.algos.losses import aggregate, kl_penalty, ppo_clip_loss, truncated_is_weights


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
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str):
    def wrap(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is registered twice")
        POLICY_LOSSES[name] = fn
        return fn

    return wrap


def get_policy_loss(name: str) -> PolicyLoss:
    if name not in POLICY_LOSSES:
        raise KeyError(f"algo.policy_loss={name!r} is not registered; choose one of {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


def _masked(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (values.detach() * mask).sum(), mask.sum()


def _extreme(values: torch.Tensor, mask: torch.Tensor, largest: bool) -> torch.Tensor:
    """The max (or min) of `values` over the tokens of `mask`; -inf (+inf) where there is none."""
    fill = -math.inf if largest else math.inf
    masked = torch.where(mask.bool(), values.detach(), fill)
    return masked.max() if largest else masked.min()


def ppo_loss(x: LossInputs, algo) -> LossOutputs:
    mask = x.loss_mask
    agg = partial(aggregate, mask=mask, mode=algo.loss_agg_mode, denominator=x.denominator, norm_length=x.norm_length)
    pg, ratio, clipped = ppo_clip_loss(
        x.logp, x.old_logp, x.advantages, algo.clip_ratio_low, algo.clip_ratio_high, algo.clip_ratio_c
    )
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
    if algo.kl_coef > 0:
        kl = kl_penalty(x.logp, x.ref_logp, algo.kl_estimator)  # KL(policy || reference), per token
        loss = loss + algo.kl_coef * agg(kl)
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


# registered by a call, not a decorator: mutation testing (scripts/mutation.py) skips decorated functions
register_policy_loss("ppo")(ppo_loss)
