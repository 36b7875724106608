"""The rollout rank: a generation engine plus its end of the weight-sync group.

A plain class; the controller wraps it in a Ray actor, tests call it directly."""

from __future__ import annotations

import torch

from rlpost.config import TrainConfig
from rlpost.data.batch import Batch
from rlpost.rollout.base import RolloutEngine, SamplingParams
from rlpost.weightsync.sync import receive_weights
from rlpost.weightsync.transport import SyncGroup


def make_engine(cfg: TrainConfig, model_path: str, pad_id: int, eos_id: int) -> RolloutEngine:
    if cfg.rollout.backend == "hf":
        from rlpost.rollout.hf import HFRolloutEngine

        # the varlen kernel serves packed training batches; generation with a KV cache uses sdpa
        attn = "sdpa" if cfg.model.attn_implementation == "rlpost_varlen" else cfg.model.attn_implementation
        return HFRolloutEngine(model_path, cfg.model.dtype, cfg.trainer.device, pad_id, eos_id,
                               cfg.rollout.batch_size, attn, cfg.model.trust_remote_code)
    raise ValueError(f"rollout.backend={cfg.rollout.backend!r} is not available in this build; "
                     "choose rollout.backend=hf")


class RolloutWorker:
    def __init__(self, cfg: TrainConfig, model_path: str, rank: int, pad_id: int, eos_id: int):
        torch.set_num_threads(cfg.cluster.num_threads)
        self.cfg, self.rank = cfg, rank
        self.engine = make_engine(cfg, model_path, pad_id, eos_id)
        self.sync_group: SyncGroup | None = None

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Batch:
        return self.engine.generate(prompts, params)

    def weight_version(self) -> int:
        return self.engine.weight_version

    def init_weight_sync(self, host: str, port: int, rank: int, world_size: int) -> None:
        self.sync_group = SyncGroup(host, port, rank, world_size, self.cfg.trainer.device,
                                    self.cfg.weight_sync.timeout_s)

    def receive_weights(self, version: int) -> dict[str, float]:
        stats = receive_weights(self.sync_group, self.engine.weight_manifest(), version,
                                self.engine.load_weights, self.engine.loaded_tensor)
        self.engine.weight_version = version
        return {"weight_sync/recv_s": stats.seconds, "weight_sync/recv_bytes": float(stats.bytes)}
