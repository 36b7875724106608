"""The pure parts of one training step: group ids, the step's plan, advantages, sampling settings,
the batch's metrics, and the guard that LoRA rollouts serve the adapter. No Ray, no models."""

from __future__ import annotations

import torch

from rlpost.algos.advantages import get_advantage
from rlpost.config import TrainConfig, mini_batch_size
from rlpost.data.batch import Batch
from rlpost.data.microbatch import plan_step
from rlpost.rollout.base import SamplingParams


def group_ids(num_prompts: int, n: int) -> torch.Tensor:
    """[num_prompts * n]: the `n` samples of each prompt are contiguous and share its index."""
    return torch.arange(num_prompts).repeat_interleave(n)


def step_plan(batch: Batch, cfg: TrainConfig):
    """(tokens per row, plan[rank][mini][micro] = row indices): contiguous mini-batches of whole
    prompt groups, each balanced over the trainer ranks by tokens (rlpost.data.microbatch)."""
    lengths = (batch["prompt_mask"].sum(-1) + batch["response_mask"].sum(-1)).tolist()
    plan = plan_step(
        lengths,
        cfg.trainer.world_size,
        cfg.data.train_batch_size // mini_batch_size(cfg),
        cfg.trainer.max_tokens_per_microbatch,
        cfg.trainer.micro_batch_size,
    )
    return lengths, plan


def advantages(batch: Batch, cfg: TrainConfig) -> torch.Tensor:
    """The advantages of `algo.advantage` for a batch with `rewards` and `group_ids`: [N] or [N, R]."""
    return get_advantage(cfg.algo.advantage)(batch, cfg.algo)


def sampling_params(cfg: TrainConfig, seed: int, n: int | None = None, greedy: bool = False) -> SamplingParams:
    """The rollout settings of `cfg` (`n` samples per prompt, default `rollout.n`)."""
    r = cfg.rollout
    return SamplingParams(
        n=r.n if n is None else n,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=r.max_response_length,
        greedy=greedy,
        seed=seed,
    )


def batch_metrics(batch: Batch, rewards: torch.Tensor, reward_errors: int, n: int) -> dict[str, float]:
    """What a generated, scored batch says: rewards, lengths, rollout/trainer log-prob agreement
    (over the model's own tokens) and the weight version that generated it."""
    lengths = batch["response_mask"].sum(-1).float()
    mask = batch["loss_mask"]
    diff = (batch["rollout_logprobs"] - batch["old_logprobs"]).abs()[mask]
    groups = rewards.view(-1, n)
    return {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "reward/errors": float(reward_errors),
        "reward/uniform_groups": (groups.max(1).values == groups.min(1).values).float().mean().item(),
        "response_length/mean": lengths.mean().item(),
        "response_length/max": lengths.max().item(),
        "rollout/logprob_diff_max": diff.max().item() if diff.numel() else 0.0,
        "rollout/logprob_diff_mean": diff.mean().item() if diff.numel() else 0.0,
        "rollout/weight_version": batch["weight_version"].float().mean().item(),
        "perf/tokens": float(batch["prompt_mask"].sum() + batch["response_mask"].sum()),
    }


class AdapterNotServedError(RuntimeError):
    """The rollouts generate with the base model, not the trained LoRA policy."""


def check_rollout_serves_adapter(batch: Batch, staleness: int, separation: float = 4.0) -> dict[str, float]:
    """verl #7014 / #7495 guard. Checksums prove the rollouts hold what the trainer sent, not that
    what was sent is the trained policy, nor that the engine applies it. So: `batch` holds, per
    response token, the rollout's log-probs (`rollout_logprobs`), the trainer policy's
    (`old_logprobs`, base + adapter) and the base model's (`ref_logprobs`, adapters disabled). A
    rollout that serves the adapter is closer to the policy than to the base; one that serves the
    base the other way round.

    Judged only when the two distances are `separation` times apart (before that, e.g. while
    the adapter is still ~0, rollout noise can put either side ahead) and the batch's generator
    had a non-zero adapter: version >= 1 (peft starts B at 0, so version 0 is the base), and for
    a stale batch (one-step-off-policy: the policy moved on since it was generated) version
    >= 1 + staleness, so that the generator's adapter outweighs the updates since. Raises
    `AdapterNotServedError` when the rollout is clearly closer to the base."""
    mask = batch["loss_mask"]
    rollout, policy, base = (batch[k][mask].double() for k in ("rollout_logprobs", "old_logprobs", "ref_logprobs"))
    to_policy = (rollout - policy).abs().mean().item() if mask.any() else 0.0
    to_base = (rollout - base).abs().mean().item() if mask.any() else 0.0
    out = {
        "lora/rollout_vs_policy": to_policy,
        "lora/rollout_vs_base": to_base,
        "lora/policy_vs_base": (policy - base).abs().mean().item() if mask.any() else 0.0,
        "lora/adapter_check": 0.0,
    }
    version = int(batch["weight_version"].min().item())
    if version < 1 + staleness or max(to_policy, to_base) <= separation * min(to_policy, to_base):
        return out  # not conclusive
    if to_policy > to_base:
        raise AdapterNotServedError(
            f"the rollouts' log-probs (batch of weight version {version}) match the base model without "
            f"the adapter (mean |diff| {to_base:.3g}) better than the trained policy ({to_policy:.3g}): "
            "the adapter does not reach generation (merged weights without it, or an adapter the "
            "engine does not apply; verl #7014, #7495)"
        )
    out["lora/adapter_check"] = 1.0
    return out
