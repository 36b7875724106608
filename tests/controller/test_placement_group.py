"""controller/placement.py's Ray-facing half against a scripted Ray (the integration tests run it on a
real one, tests/integration/test_cluster.py; the mutation run counts only tests without Ray, and found
these lines untested: benchmarks/mutation/mutation_checkpoint_loop_placement.json): the placement
group reserved, refused at once or after its deadline with what it asked and what the cluster has, a
signal during the wait, and each actor's options."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller import placement
from rlpost.controller.placement import Placement, place

REFUSED = (
    "Ray cannot place this run: its 2 bundles ask for 2 CPU, 2 GPU (KNOBS); {why} (the cluster: {have}). Free the "
    "GPUs, make them visible to Ray (CUDA_VISIBLE_DEVICES, `ray start --num-gpus`), or ask for fewer with those "
    "settings"
)


class ScriptedRay:
    """Ray's calls `place` makes: the cluster's resources, and `wait` ready after `ready_after` looks."""

    def __init__(self, monkeypatch, cluster, available=None, ready_after=None, clock=None):
        self.cluster, self.available = cluster, available or cluster
        self.ready_after, self.waits, self.made, self.removed = ready_after, [], [], []
        self.clock = clock or [0.0]
        monkeypatch.setattr(placement, "ray", self)
        monkeypatch.setattr(placement.time, "monotonic", lambda: self.clock[0])
        monkeypatch.setattr(placement, "placement_group", self.placement_group)
        monkeypatch.setattr(placement, "remove_placement_group", self.removed.append)

    def cluster_resources(self):
        return self.cluster

    def available_resources(self):
        return self.available

    def placement_group(self, bundles, strategy):
        pg = SimpleNamespace(bundles=bundles, strategy=strategy, ready=lambda: "ready-ref")
        self.made.append(pg)
        return pg

    def wait(self, refs, timeout):
        self.waits.append(timeout)
        self.clock[0] += timeout  # the look took its whole timeout
        done = self.ready_after is not None and len(self.waits) > self.ready_after
        return (refs, []) if done else ([], refs)


BUNDLES = [{"CPU": 1, "GPU": 1}] * 2


def test_a_local_ray_with_too_few_in_all_is_refused_at_once_with_what_it_has(monkeypatch):
    ray = ScriptedRay(monkeypatch, {"CPU": 4.0, "memory": 1e9, "node:1": 1.0})
    with pytest.raises(ConfigError) as info:
        place(BUNDLES, "KNOBS", local=True, timeout_s=60)
    why = "the local Ray this run started has too few in all"
    assert str(info.value) == REFUSED.format(why=why, have="CPU 4")
    assert ray.made == [] and ray.waits == []  # no group asked for, no wait


def test_a_cluster_short_now_is_waited_for_a_second_at_a_time_and_the_group_packed(monkeypatch):
    ray = ScriptedRay(monkeypatch, {"CPU": 1.0}, ready_after=2)  # an autoscaler may add them
    pg = place(BUNDLES, "KNOBS", local=False, timeout_s=60)
    assert ray.made == [pg] and (pg.bundles, pg.strategy) == (BUNDLES, "PACK")
    assert ray.waits == [1.0, 1.0, 1.0] and ray.removed == []


def test_a_group_not_placed_by_its_deadline_is_removed_and_refused_naming_what_is_free(monkeypatch):
    ray = ScriptedRay(monkeypatch, {"CPU": 8.0, "GPU": 2.0}, available={"CPU": 7.0})
    with pytest.raises(ConfigError) as info:
        place(BUNDLES, "KNOBS", local=True, timeout_s=2.5)
    assert ray.waits == [1.0, 1.0, 0.5]  # never past the deadline
    why = "not placed within 2.5 s, with CPU 7, GPU 0 free: another job holds them"
    assert str(info.value) == REFUSED.format(why=why, have="CPU 8, GPU 2")
    assert ray.removed == ray.made and len(ray.made) == 1


def test_a_signal_during_the_wait_removes_the_group_and_goes_on_up(monkeypatch):
    ray = ScriptedRay(monkeypatch, {"CPU": 8.0, "GPU": 2.0})
    looks = []

    def poll():
        looks.append(1)
        if len(looks) == 2:
            raise KeyboardInterrupt("SIGTERM")

    with pytest.raises(KeyboardInterrupt):
        place(BUNDLES, "KNOBS", local=True, timeout_s=60, poll=poll)
    assert len(ray.waits) == 2 and ray.removed == ray.made
    ray = ScriptedRay(monkeypatch, {"CPU": 8.0, "GPU": 2.0}, ready_after=0)
    place(BUNDLES, "KNOBS", local=True, timeout_s=60, poll=lambda: pytest.fail("placed: no look"))


def cfg_of(*overrides):
    return load_config(["+recipe=quickstart", *overrides])


def test_create_asks_for_the_layouts_bundles_locally_unless_a_cluster_is_named(monkeypatch):
    asked = []
    monkeypatch.setattr(placement, "place", lambda *a, **k: asked.append((a, k)) or "pg")
    cfg = cfg_of("rollout.num_workers=2", "cluster.placement=split")
    cfg.trainer.device, cfg.rollout.tensor_parallel_size = "cuda", 2
    p = Placement.create(cfg, timeout_s=7.0, poll="poll")
    (bundles, knobs), kw = asked[0]
    assert bundles == [{"CPU": 1, "GPU": 1}] * 2 + [{"CPU": 1, "GPU": 2}] * 2
    assert knobs == placement.layout_knobs(cfg) and kw == {"local": True, "timeout_s": 7.0, "poll": "poll"}
    assert (p.pg, p.trainer_bundles, p.rollout_bundles, p.rollout_gpus) == ("pg", [0, 1], [2, 3], 2)
    cfg.cluster.address = "10.0.0.1:6379"
    Placement.create(cfg)
    assert asked[1][1]["local"] is False and asked[1][1]["timeout_s"] == 300.0


def test_each_actor_takes_its_roles_share_of_its_bundle_and_a_split_engine_all_its_gpus(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    cfg = cfg_of("rollout.num_workers=1", "cluster.placement=split")
    cfg.trainer.device = "cuda"
    p = Placement("pg", [0, 1], [2], {"trainer": 0.5, "rollout": 1.0}, rollout_gpus=2)
    trainer, rollout = p.options(cfg, 1, "trainer-1", "trainer"), p.options(cfg, 2, "rollout-0", "rollout")
    assert (trainer["name"], trainer["num_cpus"], trainer["num_gpus"]) == ("trainer-1", 0.5, 0.5)
    assert (rollout["num_cpus"], rollout["num_gpus"]) == (1.0, 2.0)
    strategy = trainer["scheduling_strategy"]
    assert (strategy.placement_group, strategy.placement_group_bundle_index) == ("pg", 1)
    assert trainer["runtime_env"]["env_vars"] == Placement.env(cfg, "trainer")
    assert trainer["runtime_env"]["env_vars"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    cfg.trainer.device = "cpu"
    assert p.options(cfg, 2, "rollout-0", "rollout")["num_gpus"] == 0


def test_colocated_engines_take_their_trainer_ranks_gpus_and_others_keep_rays(monkeypatch):
    cfg = cfg_of("rollout.num_workers=1")
    p = Placement("pg", [0, 1], [0], {})
    trainers = SimpleNamespace(call=lambda method: pytest.fail(f"no call to the trainers ({method})"))
    assert p.engine_devices(cfg, trainers) == [None]  # the CPU: nothing pinned, no call
    cfg.trainer.device, cfg.rollout.tensor_parallel_size = "cuda", 2
    monkeypatch.setattr(Placement, "address_of_bundle", lambda self, b: (f"node{b}", 9000))
    trainers = SimpleNamespace(call=lambda method: {"cuda_device": ["3", "5"]}[method])
    with pytest.raises(ConfigError, match=r"on nodes \['node0', 'node1'\]"):
        p.engine_devices(cfg, trainers)
    monkeypatch.setattr(Placement, "address_of_bundle", lambda self, b: ("node", 9000 + b))
    assert p.engine_devices(cfg, trainers) == ["3,5"]
