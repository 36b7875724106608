"""Steps that cannot learn, said on the console as soon as they happen: every response cut off at
the length cap; every group of a group-baseline algorithm (GRPO, RLOO, REINFORCE++ with a
baseline) scored alike, so that every advantage is 0 and the update leaves the model as it was; a
collapsed policy (entropy and gradient 0: after too large a learning rate).
The run goes on (a later batch may differ); each kind is said when it starts and again only after
a step without it, not every step."""

from __future__ import annotations

from rlpost.algos.algorithms import ALGORITHMS
from rlpost.config import TrainConfig
from rlpost.config.rules import GROUP_ADVANTAGES


def no_signal(cfg: TrainConfig, step: int, metrics: dict[str, float]) -> dict[str, str]:
    """What in step `step`'s metrics says it could not learn, by kind: `truncated`, `uniform`, `collapsed`."""
    out, r = {}, cfg.rollout
    if metrics.get("response_length/truncated_frac", 0.0) >= 1.0:
        out["truncated"] = (
            f"warning: every response of step {step} reached rollout.max_response_length={r.max_response_length} "
            "tokens without ending (response_length/truncated_frac 1.0): the answers are cut off; raise it"
        )
    advantage = ALGORITHMS.get(cfg.algo.name).advantage
    if advantage in GROUP_ADVANTAGES and metrics.get("reward/uniform_groups", 0.0) >= 1.0:
        mean = metrics.get("reward/mean", float("nan"))
        if r.temperature < 0.1:
            why = f"rollout.temperature={r.temperature:g} makes a prompt's samples alike (0.7-1.0 is usual)"
        else:
            why = f"every answer is right or every one wrong (reward/mean {mean:.3f}), or the reward is constant"
        out["uniform"] = (
            f"warning: in step {step} every prompt's {r.n} samples scored the same reward (reward/uniform_groups "
            f"1.0), so algo.name={cfg.algo.name}'s advantages are all 0 and the step did not change the model: {why}"
        )
    collapsed = metrics.get("actor/entropy", 1.0) < 1e-6 and metrics.get("actor/grad_norm", 1.0) == 0.0
    if collapsed and r.temperature >= 0.1:  # (at a near-zero temperature `uniform` names the cause)
        out["collapsed"] = (
            f"warning: in step {step} the policy's entropy and gradient are 0 (actor/entropy, actor/grad_norm): it "
            "writes one answer with certainty and no update can move it; too large a step does this (now "
            f"trainer.optim.lr={cfg.trainer.optim.lr:g}): lower it and start again"
        )
    return out


class Alerts:
    """`no_signal` of each step, logged when a kind starts (not again while it lasts)."""

    def __init__(self, cfg: TrainConfig, log=print):
        self.cfg, self.log, self.active = cfg, log, set()

    def check(self, step: int, metrics: dict[str, float]) -> None:
        found = no_signal(self.cfg, step, metrics)
        for kind, message in found.items():
            if kind not in self.active:
                self.log(message)
        self.active = set(found)
