"""Where the rollouts run against the trainers, answered once from the config (`cluster.placement`,
`trainer.device`, `algo.max_staleness`, `rollout.tensor_parallel_size`) for every part that asks:
the bundles, the memory plan, vLLM's sleep mode, the weight sync's transport, the step loop."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Colocation:
    colocated: bool  # the rollout actors run on the trainer ranks' devices (`cluster.placement=colocate`)
    on_gpus: bool
    overlapping: bool  # generation runs while the trainer trains: split, one step or more off-policy
    tensor_parallel: int

    @classmethod
    def of(cls, cfg) -> Colocation:
        split = cfg.cluster.placement == "split"
        return cls(
            colocated=not split,
            on_gpus=cfg.trainer.device == "cuda",
            overlapping=split and cfg.algo.max_staleness > 0,
            tensor_parallel=cfg.rollout.tensor_parallel_size,
        )

    @property
    def takes_turns(self) -> bool:
        """Trainer and rollouts share GPUs and take turns: vLLM sleeps while the trainer computes,
        and the weights move by CUDA IPC."""
        return self.colocated and self.on_gpus

    @property
    def pins_engine_gpus(self) -> bool:
        """Colocated tensor-parallel engines on GPUs: each runs on its trainer ranks' GPUs, not Ray's."""
        return self.takes_turns and self.tensor_parallel > 1
