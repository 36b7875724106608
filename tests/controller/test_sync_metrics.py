"""A sync's stats reach the controller as `SyncStats` and become the `weight_sync/*` metrics in one
place (`sync_metrics`): their names, values and order, and the sync that gathers them."""

import time

import pytest

from rlpost.config import load_config
from rlpost.controller.weights import WeightSync, sync_metrics
from rlpost.weightsync.sync import SyncStats


def sent(nbytes, seconds, header_s, verify_s, peak_bytes=None):
    return SyncStats(3, nbytes, seconds, 10, 0, header_s, verify_s, peak_bytes)


def received(nbytes, seconds, verify_s, readback):
    return SyncStats(3, nbytes, seconds, 10, readback, 0.0625, verify_s)


def test_metrics_of_a_base_then_adapter_sync():
    """Bytes in all and per kind; sender and slowest receiver times summed over kinds; the sender's
    phases and peak memory the largest of any kind; the fewest tensors any receiver read back."""
    out = sync_metrics(
        3,
        ["base", "adapter"],
        [sent(1000, 0.5, 0.125, 0.25, 3 * 2**29), sent(200, 0.25, 0.375, 0.0625, 2**29)],
        [
            [received(1000, 0.625, 0.125, 7), received(1000, 0.75, 0.0625, 5)],
            [received(200, 0.375, 0.25, 4), received(200, 0.5, 0.5, 6)],
        ],
        True,
    )
    assert list(out.items()) == [
        ("weight_sync/bytes", 1200.0),
        ("weight_sync/send_s", 0.75),
        ("weight_sync/recv_s", 1.25),
        ("weight_sync/base_bytes", 1000.0),
        ("weight_sync/recv_verify_s", 0.625),
        ("weight_sync/send_header_s", 0.375),
        ("weight_sync/send_verify_s", 0.25),
        ("perf/sync_peak_gb", 1.5),
        ("weight_sync/adapter_bytes", 200.0),
        ("weight_sync/version", 3.0),
        ("weight_sync/adapter_only", 0.0),
        ("weight_sync/verified", 1.0),
        ("weight_sync/readback_tensors", 4.0),
    ]
    assert all(type(v) is float for v in out.values())


def test_metrics_of_an_adapter_sync_on_the_cpu():
    """No peak memory off CUDA; an unverified sync says so."""
    out = sync_metrics(5, ["adapter"], [sent(64, 0.5, 0.25, 0.0)], [[received(64, 0.75, 0.0, 0)]], False)
    assert out == {
        "weight_sync/bytes": 64.0,
        "weight_sync/send_s": 0.5,
        "weight_sync/recv_s": 0.75,
        "weight_sync/adapter_bytes": 64.0,
        "weight_sync/recv_verify_s": 0.0,
        "weight_sync/send_header_s": 0.25,
        "weight_sync/send_verify_s": 0.0,
        "weight_sync/version": 5.0,
        "weight_sync/adapter_only": 1.0,
        "weight_sync/verified": 0.0,
        "weight_sync/readback_tensors": 0.0,
    }


class Group:
    """A worker group whose calls return `replies` at once (the controller's view of Ray)."""

    def __init__(self, replies):
        self.replies = replies

    def call_async(self, method, *args, **kwargs):
        return list(self.replies(method, *args))

    def get(self, refs, first=None, others=None):
        return refs


def weight_sync(cfg, trainers, rollouts):
    ws = WeightSync.__new__(WeightSync)  # no placement: the groups answer directly
    ws.cfg, ws.trainers, ws.rollouts, ws.log = cfg, trainers, rollouts, print
    ws.primed, ws.last_kinds = False, []
    return ws


def test_a_sync_hands_the_senders_and_every_receivers_stats_to_the_metrics():
    """The first trainer rank that sent gives the sender's stats (the others return None); every
    rollout's stats count; a rollout that reports another version stops the run."""
    cfg = load_config(["+recipe=quickstart"])
    sender = sent(100, 0.5, 0.125, 0.25)
    receivers = [received(100, 0.625, 0.125, 3), received(100, 0.75, 0.25, 2)]
    ws = weight_sync(cfg, Group(lambda m, v: [None, sender]), Group(lambda m, v, kind: receivers))
    start = time.perf_counter()
    out = ws.sync(3)
    assert 0 < out.pop("timing_s/weight_sync") <= time.perf_counter() - start  # the sync's own time
    assert out == sync_metrics(3, ["full"], [sender], [receivers], cfg.weight_sync.verify)
    late = [receivers[0], received(100, 0.75, 0.25, 2)]
    late[1].version = 2
    ws = weight_sync(cfg, Group(lambda m, v: [sender]), Group(lambda m, v, kind: late))
    with pytest.raises(RuntimeError, match=r"rollout weight versions \[3, 2\] after the full sync v3"):
        ws.sync(3)
