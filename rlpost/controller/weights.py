"""Weight sync wiring: who sends to whom, the sync groups, one verified sync per kind, and its metrics.

Over NCCL/gloo trainer rank 0 broadcasts to every rollout actor; with CUDA IPC (colocate on GPUs)
each rank feeds the actors on its own GPU (every rank holds the full tensors after FSDP's
all-gather). With LoRA a sync carries merged weights (merge mode), or the base once per run and
then only the adapter (adapter mode): `rlpost.weightsync.kinds`.
"""

from __future__ import annotations

import math
import time

from rlpost.config import Colocation, ConfigError, TrainConfig
from rlpost.controller.cluster import WorkerGroup
from rlpost.controller.placement import Placement
from rlpost.weightsync.kinds import sync_kinds
from rlpost.weightsync.sync import SyncStats


def sync_transport(cfg: TrainConfig) -> str:
    return "ipc" if Colocation.of(cfg).takes_turns else "broadcast"


def sync_plan(cfg: TrainConfig) -> dict[int, list[tuple[int, int]]]:
    """Which trainer rank sends the weights to which (rollout actor, shard of its engine): rank 0
    to every shard of every replica over NCCL/gloo (each shard is a rank of one group), or over
    CUDA IPC the rank on each actor's GPU."""
    shards = [(r, t) for r in range(cfg.rollout.num_workers) for t in range(cfg.rollout.tensor_parallel_size)]
    if sync_transport(cfg) == "ipc":
        plan: dict[int, list[tuple[int, int]]] = {}
        for r, t in shards:
            plan.setdefault((r * cfg.rollout.tensor_parallel_size + t) % cfg.trainer.world_size, []).append((r, t))
        return plan
    return {0: shards}


def check_colocated_memory(cfg: TrainConfig, reports: list[dict[str, float]], margin_gib: float = 1.0) -> None:
    """vLLM takes `rollout.gpu_memory_utilization` of the whole GPU whenever it is awake; the
    trainer keeps its resident memory (weights, Adam states) there all along. Both must fit."""
    gib = 2**30
    for rank, rep in enumerate(reports):
        if cfg.rollout.backend != "vllm" or not rep:
            continue
        total, resident = rep["total"], rep["resident"]
        wanted = cfg.rollout.gpu_memory_utilization * total
        room = total - resident - margin_gib * gib
        if wanted > room:
            raise ConfigError(
                f"rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} asks vLLM for "
                f"{wanted / gib:.1f} GiB of the {total / gib:.1f} GiB GPU of trainer rank {rank}, but the trainer "
                f"keeps {resident / gib:.1f} GiB there between phases (+{margin_gib:.0f} GiB margin): set "
                f"rollout.gpu_memory_utilization<={math.floor(max(room, 0) / total * 100) / 100:.2f}, or free trainer "
                f"memory with trainer.param_offload=true or trainer.optim.offload=layerwise"
            )


def merge_memory(reports: tuple[dict[str, float], ...]) -> dict[str, float]:
    """The memory reports of the roles that share one device (actor and critic rank): what they
    keep there together."""
    reports = [r for r in reports if r]
    if not reports:
        return {}
    return {
        "total": reports[0]["total"],
        "free": min(r["free"] for r in reports),
        "resident": sum(r["resident"] for r in reports),
    }


class WeightSync:
    """The sync groups between a trainer group and a rollout group, and the syncs themselves."""

    def __init__(self, cfg: TrainConfig, placement: Placement, trainers: WorkerGroup, rollouts: WorkerGroup, log=print):
        self.cfg, self.trainers, self.rollouts, self.log = cfg, trainers, rollouts, log
        self.primed = False  # False until a sync brought the whole model (base) over
        self.last_kinds: list[str] = []
        calls, transport = [], sync_transport(cfg)
        addresses: dict[int, dict[int, tuple]] = {}  # actor -> shard -> (host, port, rank, world)
        for rank, receivers in sync_plan(cfg).items():
            host, port = placement.address_of_bundle(placement.trainer_bundles[rank])
            world = 1 + len(receivers)
            calls.append(trainers.submit(rank, "init_weight_sync", host, port, world, transport))
            for j, (r, t) in enumerate(receivers):
                addresses.setdefault(r, {})[t] = (host, port, 1 + j, world)
        for r, shards in addresses.items():
            calls.append(rollouts.submit(r, "init_weight_sync", [shards[t] for t in sorted(shards)], transport))
        trainers.get(calls, others=rollouts)

    def sync(self, version: int) -> dict[str, float]:
        """Bring every rollout to the trainer's policy at `version`: one verified sync per kind
        (`sync_kinds`: the plain or merged weights; in adapter mode the base once, then the
        adapter only), and its metrics (`sync_metrics`)."""
        start = time.perf_counter()
        kinds = sync_kinds(self.cfg, first=not self.primed)
        sent: list[SyncStats] = []
        received: list[list[SyncStats]] = []
        for kind in kinds:
            recv = self.rollouts.call_async("receive_weights", version, kind)
            send = self.trainers.call_async("push_weights", version, kind=kind)
            # a receiver's error names the tensor: it is raised first
            stats = self.trainers.get(recv + send, first=recv, others=self.rollouts)
            received.append(stats[: len(recv)])
            sent.append(next(s for s in stats[len(recv) :] if s is not None))  # ranks that send
            versions = [s.version for s in received[-1]]
            if versions != [version] * len(versions):  # every rollout took this sync
                raise RuntimeError(f"rollout weight versions {versions} after the {kind} sync v{version}")
        if self.cfg.model.lora.rank > 0 and kinds != self.last_kinds:  # say what travels, when it changes
            self.log(
                f"weight sync v{version}: "
                + " + ".join(f"{k} ({r[0].bytes / 2**20:.2f} MiB)" for k, r in zip(kinds, received))
            )
        self.primed, self.last_kinds = True, kinds
        metrics = sync_metrics(version, kinds, sent, received, self.cfg.weight_sync.verify)
        return {**metrics, "timing_s/weight_sync": time.perf_counter() - start}


def sync_metrics(
    version: int, kinds: list[str], sent: list[SyncStats], received: list[list[SyncStats]], verified: bool
) -> dict[str, float]:
    """The `weight_sync/*` metrics (and `perf/sync_peak_gb`) of the sync of `version`, from the
    stats of each of its `kinds`: `sent[i]` the sender's (the first trainer rank that sent),
    `received[i]` every rollout's. The only place that names them: bytes in all and per kind, the
    sender's times (summed over kinds; its header and verify phases, the slowest kind), the
    slowest receiver's (summed over kinds), the fewest tensors a receiver read back, and whether
    the sync was verified (a failed check raises before this)."""
    out: dict[str, float] = {"weight_sync/bytes": 0.0, "weight_sync/send_s": 0.0, "weight_sync/recv_s": 0.0}
    for kind, send, recv in zip(kinds, sent, received):
        out["weight_sync/bytes"] += float(send.bytes)
        out[f"weight_sync/{kind}_bytes"] = float(recv[0].bytes)
        out["weight_sync/send_s"] += send.seconds
        out["weight_sync/recv_s"] += max(s.seconds for s in recv)
        out["weight_sync/recv_verify_s"] = out.get("weight_sync/recv_verify_s", 0.0) + max(s.verify_s for s in recv)
        slowest = {"weight_sync/send_header_s": send.header_s, "weight_sync/send_verify_s": send.verify_s}
        if send.peak_bytes is not None:  # what the export needs beyond the trainer's own memory
            slowest["perf/sync_peak_gb"] = send.peak_bytes / 2**30
        for key, value in slowest.items():
            out[key] = max(out.get(key, value), value)
    return {
        **out,
        "weight_sync/version": float(version),
        "weight_sync/adapter_only": float(kinds == ["adapter"]),
        "weight_sync/verified": float(verified),
        "weight_sync/readback_tensors": float(min(s.readback for recv in received for s in recv)),
    }
