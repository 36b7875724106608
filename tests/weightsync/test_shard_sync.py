"""A weight sync into tensor-parallel shards, over a real gloo group in threads: each shard of an
engine receives every tensor whole and keeps its slice (`part`); the sync checks what each shard
received against the sender, and the slice it holds against that slice of what it received, so a
shard that keeps a wrong slice or a corrupt one fails the sync on every rank, named."""

import torch

from rlpost.weightsync.manifest import WeightSyncError, manifest_of
from rlpost.weightsync.sync import receive_weights, send_weights
from rlpost.weightsync.transport import SyncGroup, free_port
from tests.helpers import run_threads


def weights():
    g = torch.Generator().manual_seed(1)
    return [
        ("embed.weight", torch.randn(10, 8, generator=g)),  # rows split (a vocabulary)
        ("layer.0.w", torch.randn(6, 4, generator=g)),  # columns split (a row-parallel layer)
        ("layer.0.b", torch.randn(6, generator=g)),  # whole on every shard
        ("norm.half", torch.randn(4, 6, generator=g).to(torch.bfloat16)),
    ]


SPLIT = {"embed.weight": 0, "layer.0.w": 1, "norm.half": 0}  # the dimension each split tensor is cut on


class Shard:
    """Shard `rank` of `size`: keeps its slice of each split tensor and all of the others. `keep`:
    which shard's slice it actually keeps (another one's: a wrong slice); `corrupt`: a tensor whose
    slice it changes after loading; `unread`: a tensor whose slice it cannot give back."""

    def __init__(self, named, rank, size, keep=None, corrupt=None, unread=None):
        self.rank, self.size, self.keep = rank, size, rank if keep is None else keep
        self.corrupt, self.unread = corrupt, unread
        self.params = {}
        self.manifest = manifest_of(named)

    def part(self, name):
        if name not in SPLIT:
            return None
        dim = SPLIT[name]
        length = next(s.shape[dim] for s in self.manifest if s.name == name) // self.size
        return dim, self.rank * length, length

    def load(self, named):
        for name, t in named:
            p = self.part(name)
            if p is None:
                self.params[name] = t.clone()
                continue
            dim, _, length = p
            self.params[name] = t.narrow(dim, self.keep * length, length).clone()
            if name == self.corrupt:
                self.params[name].view(-1)[-1] += 1

    def loaded(self, name):
        return None if name == self.unread else self.params[name]


def sync(named, shards, version=2):
    port, world = free_port(), 1 + len(shards)

    def sender():
        group = SyncGroup("127.0.0.1", port, 0, world, "cpu", 30)
        return send_weights(group, manifest_of(named), iter([t for _, t in named]), version, 64)

    def receiver(rank, shard):
        group = SyncGroup("127.0.0.1", port, rank, world, "cpu", 30)
        return receive_weights(group, shard.manifest, version, shard.load, shard.loaded, shard.part)

    return run_threads(sender, *[lambda r=r, s=s: receiver(r, s) for r, s in enumerate(shards, start=1)])


def test_each_shard_keeps_its_slice_and_every_slice_is_read_back():
    named = weights()
    shards = [Shard(named, r, 2) for r in range(2)]
    sent, *received = sync(named, shards)
    assert not isinstance(sent, Exception), sent
    for shard, stats in zip(shards, received):
        assert not isinstance(stats, Exception), stats
        assert stats.readback == len(named)
        for name, t in named:
            p = shard.part(name)
            assert torch.equal(shard.params[name], t if p is None else t.narrow(*p))


def test_a_shard_that_keeps_another_shards_slice_fails_the_sync_on_every_rank():
    named = weights()
    sent, ok, wrong = sync(named, [Shard(named, 0, 2), Shard(named, 1, 2, keep=0)])
    assert isinstance(wrong, WeightSyncError), wrong
    assert "the part this shard holds of tensor 'embed.weight'" in str(wrong) and "(3 tensors differ)" in str(wrong)
    assert isinstance(sent, WeightSyncError) and "rollout rank 2 holds a part" in str(sent)
    assert isinstance(ok, WeightSyncError) and "failed on rollout rank 2" in str(ok)


def test_a_corrupt_slice_is_named_and_one_that_cannot_be_read_is_checked_as_received():
    named = weights()
    sent, bad, ok = sync(named, [Shard(named, 0, 2, corrupt="norm.half"), Shard(named, 1, 2)])
    assert isinstance(bad, WeightSyncError) and "tensor 'norm.half'" in str(bad) and "(1 tensors differ)" in str(bad)
    assert isinstance(sent, WeightSyncError) and "rollout rank 1 holds a part" in str(sent)
    assert isinstance(ok, WeightSyncError) and "failed on rollout rank 1" in str(ok)
    shards = [Shard(named, r, 2, unread="layer.0.w") for r in range(2)]
    sent, *received = sync(named, shards)
    assert not isinstance(sent, Exception), sent
    assert [s.readback for s in received] == [len(named) - 1] * 2


def test_four_shards_each_hold_a_quarter():
    named = [(n, torch.cat([t, t]) if SPLIT.get(n) == 0 else t) for n, t in weights()]  # rows that 4 divide
    named = [(n, torch.cat([t, t], dim=1) if SPLIT.get(n) == 1 else t) for n, t in named]
    shards = [Shard(named, r, 4) for r in range(4)]
    sent, *received = sync(named, shards)
    assert not isinstance(sent, Exception) and all(s.readback == len(named) for s in received)
    rows = torch.cat([s.params["embed.weight"] for s in shards])
    assert torch.equal(rows, dict(named)["embed.weight"])


def test_a_receivers_stats_are_its_slowest_shards_times_and_fewest_read_back():
    """`SyncStats.of_shards`: a tensor-parallel engine synced when its slowest shard was done, and
    verified what every shard read back (the fewest), whichever shard comes first."""
    from rlpost.weightsync.sync import SyncStats

    fast = SyncStats(4, 1000, 0.5, 12, readback=12, header_s=0.1, verify_s=0.2)
    slow = SyncStats(4, 1000, 0.9, 12, readback=7, header_s=0.3, verify_s=0.4)
    for shards in ([fast, slow], [slow, fast]):
        merged = SyncStats.of_shards(shards)
        assert (merged.version, merged.bytes, merged.tensors) == (4, 1000, 12)
        assert (merged.seconds, merged.readback, merged.header_s, merged.verify_s) == (0.9, 7, 0.3, 0.4)
