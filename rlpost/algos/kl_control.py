"""The KL coefficient of a KL penalty in the reward: fixed, or adaptive (Ziegler et al. 2019,
"Fine-Tuning Language Models from Human Preferences"): after each step with a batch of n samples
whose mean KL(policy || reference) per sequence is KL,

    e = clip(KL / target - 1, -0.2, 0.2),    coef <- coef * (1 + e * n / horizon)

so the coefficient grows while the policy drifts past the target and shrinks below it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KLController:
    coef: float
    target: float = 0.0  # 0: fixed
    horizon: int = 10000

    def update(self, kl: float, samples: int) -> None:
        if self.target <= 0:
            return
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * samples / self.horizon
