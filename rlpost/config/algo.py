"""The `algo` section of the schema: advantages, losses, KL, filters and staleness (`rlpost.algos`)."""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.algos.algorithms import ALGORITHMS
from rlpost.algos.losses import KL_ESTIMATORS, LOSS_AGG_MODES
from rlpost.config.knobs import knob


# ------------------------------------------------------------------------------------------ algo
@dataclass
class AlgoConfig:
    name: str = knob(
        "grpo",
        "The algorithm (rlpost.algos.algorithms; docs/algorithms.md): its advantage estimator, "
        "policy loss, KL placement, batch filter and roles.",
        ALGORITHMS,
    )
    norm_adv_by_std: bool = knob(
        True, "Divide group advantages by the group std; false gives Dr.GRPO (Liu et al. 2025)."
    )
    gamma: float = knob(1.0, "Discount of per-token returns (REINFORCE++, GAE).", ge=0, le=1)
    lam: float = knob(1.0, "GAE's lambda (Schulman et al. 2016): 1 = Monte-Carlo returns minus values.", ge=0, le=1)
    kl_target: float = knob(
        0.0,
        "Adaptive KL coefficient (Ziegler et al. 2019) for a KL in the reward: the coefficient "
        "moves so that the batch's KL approaches this target; 0 = `kl_coef` fixed.",
        ge=0,
    )
    kl_horizon: int = knob(10000, "Adaptive KL: the horizon (in samples) of the coefficient's correction.", ge=1)
    clip_ratio_low: float = knob(0.2, "PPO clip: ratios below 1 - this are clipped (Schulman et al. 2017).", ge=0, lt=1)
    clip_ratio_high: float = knob(0.2, "PPO clip: ratios above 1 + this are clipped (DAPO raises it).", ge=0)
    clip_ratio_c: float = knob(3.0, "Dual-clip bound for negative advantages (Ye et al. 2020); > 1.", gt=1)
    loss_agg_mode: str = knob(
        "token-mean",
        "How per-token losses become one number: `token-mean` over all tokens "
        "of the mini-batch (DAPO), `seq-mean-token-mean` per sequence then over sequences (GRPO), "
        "`seq-mean-token-sum-norm` token sums divided by `rollout.max_response_length`, then over "
        "sequences (Dr.GRPO, Liu et al. 2025).",
        LOSS_AGG_MODES,
    )
    kl_coef: float = knob(
        0.0,
        "Weight of the KL loss against the frozen reference policy; 0 builds "
        "no reference model. With LoRA the reference is the base model (the policy "
        "with its adapters disabled): no second model.",
        ge=0,
    )
    kl_estimator: str = knob("k3", "KL estimator (Schulman 2020): k1, k2 or k3.", KL_ESTIMATORS)
    entropy_coef: float = knob(0.0, "Weight of the entropy bonus (subtracted from the loss).", ge=0)
    ppo_epochs: int = knob(1, "Passes over each batch.", ge=1)
    ppo_mini_batch_size: int = knob(0, "Prompts per optimizer step (0 = the whole batch, one step).", ge=0)
    old_logprobs: str = knob(
        "auto",
        "Where the old log-probs (the PPO ratio's denominator) come from. `auto`: with one "
        "optimizer step per batch (`ppo_epochs` 1, one mini-batch) from the update's own forward, "
        "detached (the same values: the batch is scored by the trainer's current weights either "
        "way), else from a forward pass over the batch before the update. `separate`: always that "
        "separate pass.",
        ("auto", "separate"),
    )
    max_staleness: int = knob(
        1,
        "Split placement: how many weight versions a batch's generator may lag "
        "the trainer. 1 = one-step-off-policy (batch k+1 is generated while step k "
        "trains); 0 = synchronous. Colocate placement is always synchronous.",
        ge=0,
    )
    async_rollouts: bool = knob(
        False,
        "Split placement: the rollout actors generate without pause (fully asynchronous). Each "
        "rollout call's groups reach the controller as it finishes; a step trains the first "
        "`data.train_batch_size` groups at hand; a weight sync lands between two decoding steps "
        "of the generations under way, which go on with the new weights (partial rollouts, "
        "each token's weight version recorded). At most (`max_staleness` + 1) batches of "
        "prompts are out at once; a group whose first token lags the trainer by more than "
        "`max_staleness` versions is handled by `stale_groups`. `max_staleness=0` trains exactly "
        "what the synchronous loop trains.",
    )
    stale_groups: str = knob(
        "regenerate",
        "Async rollouts: a group older than `max_staleness` versions is generated again with the "
        "current weights (`regenerate`: every prompt still trains once) or skipped for this epoch "
        "(`drop`); counted in `async/regenerated_groups`, `async/dropped_groups`.",
        ("regenerate", "drop"),
    )
    rollout_is: str = knob(
        "token",
        "Importance correction of the rollout/trainer mismatch (each sample's own rollout log-probs, "
        "token by token: under async rollouts, those of the weights that sampled it). Truncated "
        "(TIS): each token's loss is weighted by min(pi_old / pi_rollout, rollout_is_threshold) "
        "per `token`, or by the sequence's product per `sequence`. Masked: a token whose ratio "
        "lies outside [1 / threshold, threshold] leaves the loss (`token_mask`, IcePop), or the "
        "whole sequence when its product does (`sequence_mask`, MIS); `none` = off.",
        ("none", "token", "sequence", "token_mask", "sequence_mask"),
    )
    rollout_is_threshold: float = knob(
        2.0, "Cap of the truncated importance weights; the masks' band is [1 / this, this].", ge=1
    )
    max_filter_rounds: int = knob(
        3,
        "Batch filters (DAPO's dynamic sampling): at most this many extra generation rounds per "
        "step to fill the batch with groups that pass; past it the batch is filled with groups "
        "that did not (counted in `filter/filled_groups`).",
        ge=0,
    )
    overlong_buffer: int = knob(
        0,
        "DAPO's soft overlong punishment (Yu et al. 2025): over the last this many tokens before "
        "`rollout.max_response_length` the reward falls linearly by up to "
        "`overlong_penalty`; 0 = off.",
        ge=0,
    )
    overlong_penalty: float = knob(1.0, "Largest soft overlong penalty (DAPO).", ge=0)
    overlong_filter: bool = knob(
        False, "DAPO's overlong filtering: truncated responses (no EOS at the length limit) get no loss."
    )
