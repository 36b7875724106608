"""The Ray that rlpost starts: its actors run at normal priority (at Ray's default, nice 15, the
trainer's update took 5-8% longer: benchmarks/bench_overhead.py)."""

import os

import pytest

pytestmark = pytest.mark.integration


def test_actors_run_at_normal_priority(ray_session):
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def niceness(self):
            return os.nice(0)

    assert ray.get(Probe.remote().niceness.remote()) == os.nice(0)


def test_start_ray_sets_the_niceness_for_a_local_ray_only(monkeypatch):
    import ray

    from rlpost.config import load_config
    from rlpost.controller import cluster

    seen = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    record = lambda **kw: seen.append((kw.get("address"), os.environ.get("RAY_worker_niceness")))  # noqa: E731
    monkeypatch.setattr(ray, "init", record)
    monkeypatch.setattr(cluster, "check_cluster_answers", lambda address: None)  # no cluster here to answer
    for address, expected in (("ray://elsewhere:10001", None), ("", "0")):
        monkeypatch.delenv("RAY_worker_niceness", raising=False)
        cluster.start_ray(load_config(["+recipe=quickstart", f"cluster.address={address}"]))
        assert seen[-1] == ((address or "local"), expected)  # local: a new instance, whatever RAY_ADDRESS says
    monkeypatch.setenv("RAY_worker_niceness", "5")  # the user's choice stands
    cluster.start_ray(load_config(["+recipe=quickstart"]))
    assert seen[-1] == ("local", "5")


def test_a_local_ray_is_told_the_gpus_cuda_sees(monkeypatch):
    """A local Ray's GPU count comes from CUDA (not Ray's NVML probe, which says 0 when it fails);
    on the CPU it is left to Ray."""
    import ray

    from rlpost.config import load_config
    from rlpost.controller import cluster

    seen = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(kw.get("num_gpus", "absent")))
    monkeypatch.setattr(cluster, "visible_gpus", lambda: 3)
    cfg = load_config(["+recipe=quickstart", "trainer.device=cpu"])
    cluster.start_ray(cfg)
    cfg.trainer.device = "cuda"  # (a config of a machine with GPUs; this one has none to check it against)
    cluster.start_ray(cfg)
    assert seen == [None, 3]


def test_a_placement_ray_cannot_make_is_refused_with_what_it_asked_and_what_is_free(ray_session):
    """A local Ray with too few GPUs in all is refused at once (it never grows); a group that other
    jobs keep from being placed stops after the timeout, saying what is free; neither hangs."""
    import time

    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from rlpost.config import ConfigError
    from rlpost.controller.placement import place, shortfall

    assert shortfall([{"CPU": 1, "GPU": 1}] * 2, {"CPU": 4.0, "GPU": 1.0}) == {"GPU": 2}
    assert shortfall([{"CPU": 1}] * 4, {"CPU": 4.0}) == {}
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"ask for 2 CPU, 2 GPU \(KNOBS\); the local Ray .* too few in all"):
        place([{"CPU": 1, "GPU": 1}] * 2, "KNOBS", local=True, timeout_s=60)
    assert time.monotonic() - start < 10
    held = placement_group([{"CPU": 4}])
    ray.get(held.ready(), timeout=60)
    try:
        with pytest.raises(ConfigError, match=r"not placed within 1 s, with CPU 0 free: another job holds"):
            place([{"CPU": 1}], "KNOBS", local=True, timeout_s=1)
    finally:
        remove_placement_group(held)
    pg = place([{"CPU": 1}], "KNOBS", local=False, timeout_s=60)  # freed: placed
    remove_placement_group(pg)
