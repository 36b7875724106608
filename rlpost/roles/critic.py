"""The critic role on a trainer rank: a value model (the policy's body with a scalar head) on its
own FSDP2 engine (`rlpost.trainer.engine`: `critic.model_path`, `critic.optim`, no LoRA, metrics
`critic/...`, checkpoint `critic/`), for algorithms with a
learned baseline (PPO, `rlpost.algos.algorithms`). It gives the values of a batch before the
advantages are computed (GAE) and trains on the returns with PPO's clipped value loss
(`algo.loss_agg_mode` over the loss tokens, the same mini-batches and epochs as the actor).

A plain class: the controller wraps it in a Ray actor (a worker group on the trainer's bundles, a
process group of its own), tests call it directly.
"""

from __future__ import annotations

import time
from functools import partial

import torch
import torch.distributed as dist

from rlpost.algos.losses import aggregate, clipped_value_loss
from rlpost.config import TrainConfig
from rlpost.data.batch import Batch
from rlpost.data.microbatch import split_shard
from rlpost.models.loading import load_value_model
from rlpost.trainer.engine import EngineSpec, FSDPEngine
from rlpost.trainer.logprobs import resolve_layout, response_values
from rlpost.trainer.stats import Stats


class CriticWorker:
    def __init__(
        self, cfg: TrainConfig, model_path: str, rank: int, world_size: int, master_addr: str, master_port: int
    ):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        m = cfg.model
        load = partial(load_value_model, model_path, "float32", m.attn_implementation, m.trust_remote_code)
        spec = EngineSpec(
            load, cfg.critic.optim, None, prefix="critic", name="critic", step_timing="critic_optimizer_step"
        )
        self.engine = e = FSDPEngine(cfg, spec, rank, world_size, master_addr, master_port)
        self.model, self.device = e.model, e.device
        self.layout = resolve_layout(cfg.trainer.layout, cfg.model.attn_implementation, cfg.trainer.device)
        e.offload_params()

    def compute_values(self, shard: Batch) -> Batch:
        """`values` [b, R] of the shard's rows, with their `row_index`."""
        values, rows = [], []
        with torch.no_grad(), self.engine.resident():
            for mini in split_shard(shard):
                for mb in mini:
                    values.append(response_values(self.model, mb, self.layout).cpu())
                    rows.append(mb["row_index"])
        return Batch({"values": torch.cat(values), "row_index": torch.cat(rows)})

    def update(self, shard: Batch) -> dict[str, float]:
        """Epochs over the planned mini-batches, one optimizer step each, on the clipped value
        loss against `returns` (targets) and `values` (the values before the update). Returns the
        metrics reduced over ranks."""
        start = time.perf_counter()
        a = self.cfg.algo
        stats = Stats(self.device)
        with self.engine.resident():
            micro_step = lambda mb, denominator, first: self._micro_step(mb, denominator, stats)  # noqa: E731
            self.engine.train(split_shard(shard), a.ppo_epochs, a.loss_agg_mode, micro_step, stats)
            metrics = stats.reduce()
        metrics["timing_s/critic_update_worker"] = time.perf_counter() - start
        return metrics

    def _micro_step(self, mb: Batch, denom: torch.Tensor, stats: Stats) -> None:
        dev = self.device
        values = response_values(self.model, mb, self.layout)
        old, returns = mb["values"].to(dev), mb["returns"].to(dev)
        mask = mb["loss_mask"].to(dev).float()
        loss, clipped = clipped_value_loss(values, old, returns, self.cfg.critic.value_clip)
        agg = aggregate(
            loss, mask, self.cfg.algo.loss_agg_mode, denominator=denom, norm_length=self.cfg.rollout.max_response_length
        )
        (agg * self.world_size).backward()
        stats.add("critic/vf_loss", (loss.detach() * mask).sum(), mask.sum())
        stats.add("critic/vf_clipfrac", (clipped.float() * mask).sum(), mask.sum())
        stats.add("critic/values", (values.detach() * mask).sum(), mask.sum())
        stats.add("critic/returns", (returns * mask).sum(), mask.sum())

    def save_checkpoint(self, folder: str) -> None:
        self.engine.save_checkpoint(folder)
        dist.barrier()

    def load_checkpoint(self, folder: str) -> None:
        self.engine.load_checkpoint(folder)

    def memory_report(self) -> dict[str, float]:
        return self.engine.memory_report()

    def release_memory(self) -> None:
        self.engine.release_memory()

    def shutdown(self) -> None:
        self.engine.shutdown()
