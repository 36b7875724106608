"""LoRA: when a step spends one more forward (the base model's log-probs, adapters disabled) to
check that the rollouts serve the trained adapter (`step.check_rollout_serves_adapter`).

The check is due from the first batch whose generator held a non-zero adapter, until it passes;
after a validation it is due again. While it cannot tell (the adapter's effect still inside the
rollout noise, as for the first tens of steps of a small learning rate) it waits 1, 2, 4, then at
most `max_wait` steps between tries: a LoRA run on SmolLM2 whose check stayed inconclusive for 16
steps paid the extra forward on every one of them (benchmarks/real_model/steps_lora_h100x2.json)."""

from __future__ import annotations

from rlpost.controller.step import check_rollout_serves_adapter
from rlpost.data.batch import Batch


class AdapterProbe:
    def __init__(self, lora: bool, max_wait: int = 8):
        self.lora, self.max_wait = lora, max_wait
        self.rearm()

    def rearm(self) -> None:
        """Check again at the next chance (a run's start, after each validation)."""
        self.passed, self.next_step, self.wait = not self.lora, 0, 1

    def due(self, step: int, batch: Batch, staleness: int) -> bool:
        """Whether this step's batch carries the base model's log-probs for the check."""
        version_ok = batch["weight_version"].min().item() >= 1 + staleness  # its generator had an adapter
        return not self.passed and step >= self.next_step and version_ok

    def check(self, step: int, batch: Batch, staleness: int) -> dict[str, float]:
        """The check's metrics for a batch that carries `ref_logprobs` ({} for one without);
        raises `AdapterNotServedError` when the rollouts clearly serve the base model."""
        if not (self.lora and "ref_logprobs" in batch):
            return {}
        out = check_rollout_serves_adapter(batch, staleness)
        if out["lora/adapter_check"]:
            self.passed = True
        else:  # inconclusive: try again later
            self.next_step, self.wait = step + self.wait, min(2 * self.wait, self.max_wait)
        return out
