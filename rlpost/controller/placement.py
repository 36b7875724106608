"""Placing a run's actors: one Ray placement group for the whole job.

- `colocate`: one bundle per trainer rank; rollout actor i shares bundle i % world_size with
  trainer rank i (and its critic and reward-model ranks, when the run has them), each taking an
  equal part of its CPU (and GPU): they take turns on the same device.
- `split`: trainer bundles first (shared by the actor, critic and reward-model ranks), then one
  bundle per rollout actor: disjoint devices.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlpost.config import Colocation, ConfigError, TrainConfig
from rlpost.controller.cluster import actor_env

if TYPE_CHECKING:
    from rlpost.controller.cluster import WorkerGroup


EXPANDABLE = "expandable_segments:True"


def allocator_conf(cfg: TrainConfig, role: str, user: str | None) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF for a role's actor, or None to leave the environment's. A split run's
    trainer GPUs get PyTorch's expandable segments: without them the caching allocator held 45.1 GiB
    over an update whose peak was 25.8 GiB (0.5B, split 1 + 1: 47.1 GiB of the GPU by nvidia-smi
    against 29.4 with them; benchmarks/multi_gpu/alloc_h200x4.json). Added to the user's setting
    (`user`) unless it names expandable_segments itself. Colocated runs are not yet measured with them."""
    if role == "rollout" or cfg.trainer.device != "cuda" or Colocation.of(cfg).colocated:
        return None
    if user and "expandable_segments" in user:
        return None
    return f"{user},{EXPANDABLE}" if user else EXPANDABLE


@ray.remote
def _address() -> tuple[str, int]:
    from rlpost.weightsync.transport import free_port

    return ray.util.get_node_ip_address(), free_port()


def bundle_layout(cfg: TrainConfig, roles=("actor", "rollout")) -> tuple[list[dict], list[int], list[int], dict]:
    """(the placement group's bundles, the trainer ranks' bundles, the rollout actors' bundles, the
    share of its bundle each role's actor takes). Colocated, rollout actor i shares the bundle of
    trainer rank i T (its engine's T shards use the GPUs of ranks i T .. i T + T - 1: `engine_devices`);
    split, each rollout actor has a bundle of its own, with one GPU per shard of its engine (a
    bundle lies on one node, as a tensor-parallel engine must)."""
    ws, nr = cfg.trainer.world_size, cfg.rollout.num_workers
    gpu = cfg.trainer.device == "cuda"
    bundle = {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1}
    # on the trainer bundles: the actor (trainer), and the critic and the reward model if any
    on_trainer_bundles = 1 + sum(role in roles for role in ("critic", "reward_model"))
    if Colocation.of(cfg).colocated:
        share = 1.0 / (on_trainer_bundles + 1)
        shares = {"trainer": share, "critic": share, "reward_model": share, "rollout": share}
        rollouts = [(i * cfg.rollout.tensor_parallel_size) % ws for i in range(nr)]  # on its first shard's GPU
        return [dict(bundle) for _ in range(ws)], list(range(ws)), rollouts, shares
    engine = dict(bundle, GPU=cfg.rollout.tensor_parallel_size) if gpu else dict(bundle)
    share = 1.0 / on_trainer_bundles
    shares = {"trainer": share, "critic": share, "reward_model": share, "rollout": 1.0}
    bundles = [dict(bundle) for _ in range(ws)] + [dict(engine) for _ in range(nr)]
    return bundles, list(range(ws)), list(range(ws, ws + nr)), shares


def engine_devices(cfg: TrainConfig, devices: list[str], nodes: list[str]) -> list[str | None]:
    """Colocated tensor-parallel engines on GPUs: for each rollout actor the CUDA_VISIBLE_DEVICES
    of its engine's shards, the GPUs of trainer ranks i T .. i T + T - 1 (`devices`: each rank's,
    as Ray numbers them on its node; `nodes`: each rank's node), which must lie on one node; None
    where the actor keeps the GPU Ray gave it."""
    t, nr = cfg.rollout.tensor_parallel_size, cfg.rollout.num_workers
    if not Colocation.of(cfg).pins_engine_gpus:
        return [None] * nr
    out = []
    for i in range(nr):
        ranks = range(i * t, i * t + t)
        if len({nodes[k] for k in ranks}) > 1:
            raise ConfigError(
                f"rollout.tensor_parallel_size={t}: the engine of rollout actor {i} would span trainer ranks "
                f"{ranks[0]}..{ranks[-1]} on nodes {sorted({nodes[k] for k in ranks})}; an engine's shards must "
                "share a node: use a tensor_parallel_size that divides the GPUs per node"
            )
        out.append(",".join(devices[k] for k in ranks))
    return out


def layout_knobs(cfg: TrainConfig) -> str:
    return (
        f"cluster.placement={cfg.cluster.placement}, trainer.world_size={cfg.trainer.world_size}, "
        f"rollout.num_workers={cfg.rollout.num_workers}, "
        f"rollout.tensor_parallel_size={cfg.rollout.tensor_parallel_size}"
    )


def resource_totals(bundles: list[dict]) -> dict[str, float]:
    total: dict[str, float] = {}
    for bundle in bundles:
        for key, amount in bundle.items():
            total[key] = total.get(key, 0) + amount
    return total


def shortfall(bundles: list[dict], cluster: dict[str, float]) -> dict[str, float]:
    """Per resource, what the bundles ask for beyond all the cluster has (empty: it could fit)."""
    return {k: v for k, v in resource_totals(bundles).items() if cluster.get(k, 0) < v}


def place(bundles: list[dict], knobs: str, local: bool, timeout_s: float, poll=None):
    """The run's placement group, reserved, or a ConfigError that says what it asked for and what
    the cluster has: at once where a local Ray (it never grows) has too little in all, else after
    `timeout_s` (other jobs hold the resources, or an autoscaler did not add them)."""

    def refuse(why: str) -> ConfigError:
        want = ", ".join(f"{v:g} {k}" for k, v in resource_totals(bundles).items())
        have = ", ".join(f"{k} {v:g}" for k, v in sorted(ray.cluster_resources().items()) if k in ("CPU", "GPU"))
        return ConfigError(
            f"Ray cannot place this run: its {len(bundles)} bundles ask for {want} ({knobs}); {why} "
            f"(the cluster: {have or 'no CPU or GPU'}). Free the GPUs, make them visible to Ray "
            "(CUDA_VISIBLE_DEVICES, `ray start --num-gpus`), or ask for fewer with those settings"
        )

    missing = shortfall(bundles, ray.cluster_resources())
    if missing and local:
        raise refuse("the local Ray this run started has too few in all")
    pg = placement_group(bundles, strategy="PACK")
    ready, until = [], time.monotonic() + timeout_s
    while not ready and time.monotonic() < until:  # a second at a time: `poll` may stop the wait (a signal)
        ready, _ = ray.wait([pg.ready()], timeout=min(1.0, max(0.0, until - time.monotonic())))
        if not ready and poll is not None:
            try:
                poll()
            except BaseException:
                remove_placement_group(pg)
                raise
    if not ready:
        remove_placement_group(pg)
        available = ray.available_resources()
        free = ", ".join(f"{k} {available.get(k, 0):g}" for k in resource_totals(bundles))
        raise refuse(f"not placed within {timeout_s:g} s, with {free} free: another job holds them")
    return pg


@dataclass
class Placement:
    pg: object
    trainer_bundles: list[int]
    rollout_bundles: list[int]
    shares: dict[str, float]  # per role: the fraction of its bundle each of its actors takes
    rollout_gpus: int = 1  # GPUs of a rollout bundle (split: one per shard of a tensor-parallel engine)

    @staticmethod
    def create(cfg: TrainConfig, roles=("actor", "rollout"), timeout_s: float = 300.0, poll=None) -> "Placement":
        bundles, trainers, rollouts, shares = bundle_layout(cfg, roles)
        pg = place(bundles, layout_knobs(cfg), local=not cfg.cluster.address, timeout_s=timeout_s, poll=poll)
        return Placement(pg, trainers, rollouts, shares, int(bundles[rollouts[0]].get("GPU", 1)))

    def options(self, cfg: TrainConfig, bundle: int, name: str, role: str) -> dict:
        gpu = cfg.trainer.device == "cuda"
        share = self.shares[role]
        return {
            "name": name,
            "num_cpus": share,
            "num_gpus": share * (self.rollout_gpus if role == "rollout" else 1) if gpu else 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=bundle
            ),
            "runtime_env": {"env_vars": self.env(cfg, role)},
        }

    @staticmethod
    def env(cfg: TrainConfig, role: str) -> dict[str, str]:
        env = actor_env(cfg)
        conf = allocator_conf(cfg, role, os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        return env

    def engine_devices(self, cfg: TrainConfig, trainers: "WorkerGroup") -> list[str | None]:
        """Each rollout actor's CUDA_VISIBLE_DEVICES (`engine_devices`), None for Ray's own."""
        if not Colocation.of(cfg).pins_engine_gpus:  # (no call to the trainers)
            return [None] * cfg.rollout.num_workers
        nodes = [self.address_of_bundle(b)[0] for b in self.trainer_bundles]
        return engine_devices(cfg, trainers.call("cuda_device"), nodes)

    def address_of_bundle(self, bundle: int) -> tuple[str, int]:
        """(node ip, free port) on the node that holds `bundle`."""
        return ray.get(
            _address.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=bundle
                ),
                num_cpus=0,
            ).remote()
        )

    def remove(self) -> None:
        remove_placement_group(self.pg)
