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
        assert seen[-1] == ((address or None), expected)
    monkeypatch.setenv("RAY_worker_niceness", "5")  # the user's choice stands
    cluster.start_ray(load_config(["+recipe=quickstart"]))
    assert seen[-1] == (None, "5")
