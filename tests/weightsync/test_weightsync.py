"""Weight sync over a real gloo group: sender and receivers run in threads of this process."""

import pytest
import torch

from rlpost.weightsync.buckets import plan_buckets
from rlpost.weightsync.checksums import checksum
from rlpost.weightsync.manifest import WeightSyncError, manifest_of, spec_of
from rlpost.weightsync.sync import receive_weights, send_weights
from rlpost.weightsync.transport import SyncGroup, ephemeral_ports, free_port
from rlpost.weightsync.verdict import compare_manifests
from tests.helpers import run_threads


class Engine:
    """A receiver that holds tensors in a dict, like a rollout engine's parameters."""

    def __init__(self, named, corrupt: str | None = None):
        self.params = {n: torch.zeros_like(t) for n, t in named}
        self.corrupt = corrupt

    def load(self, named):
        for name, t in named:
            self.params[name].copy_(t)
            if name == self.corrupt:
                self.params[name].view(-1)[0] += 1

    def loaded(self, name):
        return self.params[name]


def weights():
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(10, 4, generator=g)),
        ("layer.0.w", torch.randn(4, 4, generator=g)),
        ("layer.0.b", torch.randn(4, generator=g)),
        ("norm.half", torch.randn(6, generator=g).to(torch.bfloat16)),
    ]


def sync(named, engines, version=3, sender_version=None, bucket_bytes=64, verify=True, sent=None):
    """One sync of `named` from a sender to `engines` (`sent`: the tensors the sender is handed, when
    they differ from its manifest's)."""
    port = free_port()
    world = 1 + len(engines)
    manifest = manifest_of(named)

    def sender():
        group = SyncGroup("127.0.0.1", port, 0, world, "cpu", 30)
        return send_weights(
            group,
            manifest,
            iter([t for _, t in sent or named]),
            sender_version if sender_version is not None else version,
            bucket_bytes,
            verify,
        )

    def receiver(rank, engine):
        def fn():
            group = SyncGroup("127.0.0.1", port, rank, world, "cpu", 30)
            expected = manifest_of(engine.params.items())
            return receive_weights(group, expected, version, engine.load, engine.loaded)

        return fn

    return run_threads(sender, *[receiver(i + 1, e) for i, e in enumerate(engines)])


def test_sync_delivers_every_tensor_bitwise_to_every_receiver():
    named = weights()
    engines = [Engine(named), Engine(named)]
    sent, *received = sync(named, engines)
    assert not isinstance(sent, Exception), sent
    assert sent.version == 3 and sent.tensors == 4
    assert sent.bytes == sum(t.numel() * t.element_size() for _, t in named)
    for engine, stats in zip(engines, received):
        assert stats.bytes == sent.bytes
        for name, t in named:
            assert torch.equal(engine.params[name], t)


@pytest.mark.parametrize("verify", [True, False])
def test_manifest_mismatch_names_the_tensor_on_both_sides(verify):
    named = weights()
    wrong = [(n, torch.zeros(5, 4) if n == "embed.weight" else t) for n, t in named]
    sent, received = sync(named, [Engine(wrong)], verify=verify)
    assert isinstance(received, WeightSyncError) and "'embed.weight'" in str(received)
    assert "[10, 4]" in str(received) and "[5, 4]" in str(received)
    assert isinstance(sent, WeightSyncError) and "rank 1 refused" in str(sent)


@pytest.mark.parametrize("wrong", [torch.zeros(5, 4), torch.zeros(10, 4, dtype=torch.bfloat16)])
def test_the_sender_refuses_a_tensor_its_manifest_does_not_describe(wrong):
    """The trainer's export hands over a tensor of another shape or dtype than the manifest's: the
    sender names it before packing it (alone in its group: it sends nothing a receiver would wait for)."""
    named = weights()
    (sent,) = sync(named, [], sent=[(n, wrong if n == "embed.weight" else t) for n, t in named])
    assert isinstance(sent, WeightSyncError) and "'embed.weight'" in str(sent), sent
    assert f"is {list(wrong.shape)} {wrong.dtype}, its manifest says [10, 4] float32" in str(sent)


def test_one_refusing_receiver_fails_the_sync_on_every_rank_without_a_hang():
    """The receiver that refuses takes part in the transfer without loading; the others load,
    and learn from the verdict that the sync failed elsewhere."""
    named = weights()
    wrong = [(n, torch.zeros(5, 4) if n == "embed.weight" else t) for n, t in named]
    good, refusing = Engine(named), Engine(wrong)
    sent, ok, refused = sync(named, [good, refusing])
    assert isinstance(refused, WeightSyncError) and "'embed.weight'" in str(refused)
    assert not refusing.params["layer.0.w"].any()  # it loaded nothing
    assert isinstance(sent, WeightSyncError) and "rank 2 refused" in str(sent)
    assert isinstance(ok, WeightSyncError) and "failed on rollout rank 2" in str(ok)
    assert "every tensor intact" in str(ok)
    sent, ok, refused = sync(named, [Engine(named), Engine(wrong)], verify=False)
    assert isinstance(sent, WeightSyncError) and "rank 2 refused" in str(sent)
    assert isinstance(ok, WeightSyncError) and str(ok).endswith("this rank loaded every tensor")
    for name, t in named:
        assert torch.equal(good.params[name], t)


def test_a_corrupt_receiver_is_named_by_itself_and_its_tensor_by_the_sender():
    named = weights()
    sent, ok, bad = sync(named, [Engine(named), Engine(named, corrupt="norm.half")])
    assert isinstance(bad, WeightSyncError) and "'norm.half'" in str(bad) and "1 tensors differ" in str(bad)
    assert isinstance(sent, WeightSyncError) and "'norm.half'" in str(sent)
    assert isinstance(ok, WeightSyncError) and "this rank loaded every tensor intact" in str(ok)


def test_staging_buffers_reused_by_other_layouts_keep_their_padding_zero():
    """The sender packs bucket b into staging buffer b % 2, kept between syncs: the first bucket
    of the second sync lands where the third bucket of the first wrote data past its own tensor.
    A dirty pad would change the sent checksum but not the engine's: verification would fail."""
    g = torch.Generator().manual_seed(2)
    named = [(f"t{i}", torch.randn(n, generator=g)) for i, n in enumerate([64, 300, 150, 100, 300, 16])]
    from rlpost.weightsync.plan import send_plan

    assert send_plan(manifest_of(named), 2048).buckets == [[0], [1, 2], [3, 4], [5]]
    engine = Engine(named)
    for version in (3, 4):
        named = [(n, t + 1) for n, t in named]
        sent, received = sync(named, [engine], version=version, bucket_bytes=2048)
        assert not isinstance(received, Exception), received
        for name, t in named:
            assert torch.equal(engine.params[name], t)


def test_version_mismatch_is_refused():
    named = weights()
    sent, received = sync(named, [Engine(named)], version=3, sender_version=4)
    assert isinstance(received, WeightSyncError) and "version 4" in str(received)
    assert isinstance(sent, WeightSyncError)


def test_checksum_mismatch_names_the_tensor():
    named = weights()
    sent, received = sync(named, [Engine(named, corrupt="layer.0.b")])
    assert isinstance(received, WeightSyncError) and "'layer.0.b'" in str(received)
    assert isinstance(sent, WeightSyncError) and "checksum" in str(sent)


def test_checksum_sees_moved_data_and_single_bits():
    t = torch.arange(600, dtype=torch.float32)  # rows of 1 KiB: 256 elements
    swapped = t.clone()
    swapped[[0, 300]] = swapped[[300, 0]]  # across rows
    shifted = torch.roll(t, 1)
    flipped = t.clone()
    flipped.view(torch.int32)[5] ^= 1
    rows = t.clone()
    rows[:256], rows[256:512] = t[256:512], t[:256]  # two whole rows exchanged
    assert checksum(t) == checksum(t.clone())
    assert len({checksum(x) for x in (t, swapped, shifted, flipped, rows)}) == 5
    assert checksum(torch.ones(3, dtype=torch.bfloat16)) == checksum(torch.ones(3, dtype=torch.bfloat16))
    assert checksum(torch.ones(3, dtype=torch.bfloat16)) != checksum(torch.ones(3, dtype=torch.float16))


def test_batched_checksums_equal_one_by_one(monkeypatch):
    """A bucket's checksums (a fixed number of kernels) and grouped ones equal each tensor's own,
    for tensors that fill whole rows and ones that do not, and dtypes of every width; buckets
    unpack to the tensors packed."""
    from rlpost.weightsync import checksums as cs
    from rlpost.weightsync import packing

    g = torch.Generator().manual_seed(0)
    aligned = [torch.randn(n, generator=g).to(torch.bfloat16) for n in (1024, 512, 5120, 1536)]
    ragged = [torch.randn(n, generator=g).to(torch.bfloat16) for n in (1024, 7, 1057)]
    mixed = [
        torch.randn(5, 256, generator=g),
        torch.randint(-9, 9, (1280,), generator=g),
        torch.randn(512, generator=g).to(torch.float16),
        torch.rand(21, generator=g) > 0.5,
        torch.randn(7, generator=g).double(),
        torch.randn(9, 6, generator=g).t(),
    ]  # not contiguous
    one_by_one = {id(t): checksum(t) for t in aligned + ragged + mixed}
    assert len(set(one_by_one.values())) == len(one_by_one)
    for bucket in (aligned, ragged):
        flat = packing.pack(bucket, torch.device("cpu"))
        assert flat.numel() == sum(packing.padded(t.numel(), 2) for t in bucket)
        assert cs.bucket_checksums(flat, [t.numel() for t in bucket]).tolist() == [one_by_one[id(t)] for t in bucket]
        places = packing.layout([t.shape for t in bucket], 2)
        assert all(torch.equal(a, b) for a, b in zip(packing.unpack(flat, places), bucket, strict=True))
    monkeypatch.setattr(cs, "_GROUP_BYTES", 4000)  # groups of a few tensors
    monkeypatch.setattr(cs, "_ALONE_BYTES", 5000)  # and the largest ones alone
    everything = aligned + ragged + mixed
    assert cs.checksums(everything) == [one_by_one[id(t)] for t in everything]
    late = torch.randn(4000, generator=g).to(torch.bfloat16)[1:3073]  # alone, and starts mid-word
    assert cs.checksums([late]) == [checksum(late.clone())]
    # the definition: sum over 1 KiB rows r of (r + 1) * (row r's sum of 32-bit words mod 2**32),
    # the last row zero-padded
    t = torch.cat([torch.full((300,), -1, dtype=torch.int32), torch.full((213,), 2**31 - 1, dtype=torch.int32)])
    padded = torch.cat([t.to(torch.int64), torch.zeros(255, dtype=torch.int64)]).view(-1, 256).sum(1)
    wrapped = (padded + 2**31) % 2**32 - 2**31
    assert checksum(t) == int((wrapped * torch.arange(1, wrapped.numel() + 1)).sum())


def test_read_back_equals_checksums_call_after_call(monkeypatch):
    """`ReadBack` (kept staging buffer, cached views) gives what `checksums` gives, for groups whose
    rows end in padding after a group that filled the same staging bytes, large tensors read in
    place, misaligned and non-contiguous ones, dtypes of every width, and new values every call."""
    from rlpost.weightsync import checksums as cs

    monkeypatch.setattr(cs, "_GROUP_BYTES", 6000)
    monkeypatch.setattr(cs, "_ALONE_BYTES", 5000)
    g = torch.Generator().manual_seed(1)

    def tensors():
        return [
            torch.randn(1500, generator=g),
            torch.randn(7, generator=g).to(torch.bfloat16),
            torch.randn(300, generator=g).to(torch.bfloat16),
            torch.randn(2, 700, generator=g),
            torch.randn(4000, generator=g).to(torch.bfloat16)[1:3073],  # large, starts mid-word
            torch.randn(9, 6, generator=g).t(),
            torch.rand(21, generator=g) > 0.5,
            torch.randint(-9, 9, (1280,), generator=g),
            torch.randn(3, generator=g).double(),
        ]

    first = tensors()
    reader = cs.ReadBack(first)
    assert any(gr.dtype is None for gr in reader.groups) and sum(gr.dtype is not None for gr in reader.groups) >= 4
    for ts in (first, tensors(), tensors()):
        assert reader.matches(ts)
        assert reader(ts).tolist() == [checksum(t) for t in ts]
    assert not reader.matches(first[:-1] + [first[-1].float()])
    assert not reader.matches(first[:-1] + [torch.zeros(4, dtype=torch.float64)])


def test_buckets_respect_size_and_dtype():
    specs = [
        spec_of("a", torch.zeros(4)),
        spec_of("b", torch.zeros(4)),
        spec_of("c", torch.zeros(100)),
        spec_of("d", torch.zeros(2, dtype=torch.bfloat16)),
    ]
    assert plan_buckets(specs, 32) == [[0], [1], [2], [3]]  # first and last: at most 4 bytes
    assert plan_buckets(specs, 256) == [[0, 1], [2], [3]]
    same = [spec_of(f"t{i}", torch.zeros(4)) for i in range(10)]  # 16 bytes each
    assert plan_buckets(same, 128) == [[0], list(range(1, 9)), [9]]
    assert plan_buckets(same, 2048) == [list(range(10))]
    assert plan_buckets(same[:1], 8) == [[0]] and plan_buckets([], 8) == []
    assert compare_manifests(specs, specs) is None
    assert "not sent" in compare_manifests(specs, specs[:3])
    assert "no such tensor" in compare_manifests(specs[:3], specs)


class FusedEngine(Engine):
    """Keeps some tensors in a layout it cannot hand back (like vLLM's fused or repacked
    kernels): verification falls back to the checksum of the received bytes for those."""

    def loaded(self, name):
        return None if name.startswith("layer.") else self.params[name]


def test_engine_without_readback_is_verified_by_received_bytes():
    named = weights()
    engine = FusedEngine(named)
    sent, received = sync(named, [engine])
    assert not isinstance(received, Exception), received
    assert received.readback == 2  # embed.weight and norm.half read back; layer.* as received
    for name, t in named:
        assert torch.equal(engine.params[name], t)


class StopsEarly(Engine):
    def load(self, named):
        for _, (name, t) in zip(range(2), named):
            self.params[name].copy_(t)


@pytest.mark.parametrize("verify", [True, False])
def test_engine_that_skips_tensors_is_an_error_not_a_hang(verify):
    named = weights()
    sent, received = sync(named, [StopsEarly(named)], verify=verify)
    assert isinstance(received, WeightSyncError) and "loaded 2 of 4" in str(received)
    assert isinstance(sent, WeightSyncError) and "rank 1" in str(sent)


def test_control_messages_of_any_size():
    """Headers and checksum lists travel in one fixed-size broadcast, longer ones in two."""
    port = free_port()
    small, large = {"version": 3}, list(range(40_000))  # ~200 KB pickled

    def rank(r):
        group = SyncGroup("127.0.0.1", port, r, 2, "cpu", 30)
        return [group.broadcast_object(small if r == 0 else None), group.broadcast_object(large if r == 0 else None)]

    assert run_threads(lambda: rank(0), lambda: rank(1)) == [[small, large]] * 2


def test_a_stuck_block_prints_every_thread_stack_and_a_quick_one_prints_nothing():
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import time
        from rlpost.weightsync.transport import stacks_if_stuck
        def quick_sync():
            with stacks_if_stuck(1.0):
                time.sleep(0.1)
        def stuck_sync():
            with stacks_if_stuck(0.3):
                time.sleep(1.5)
        quick_sync()
        time.sleep(1.5)  # past the quick block's deadline: it was cancelled
        print("between", flush=True)
        stuck_sync()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "between\n"
    assert out.stderr.count("Timeout (") == 1 and "in stuck_sync" in out.stderr, out.stderr
    assert "quick_sync" not in out.stderr


def test_differs_names_the_first_tensor_some_rank_holds_otherwise():
    from rlpost.weightsync.verdict import differs

    n = 3
    sums = [11, -7, 2**40]
    agree = [0, 0, 0, *sums, *sums, *[~s for s in sums]]  # highest == lowest for every tensor
    assert differs(agree, n) is None
    for i in range(n):
        low = list(sums)
        low[i] -= 1  # one rank holds tensor i with another checksum
        assert differs([0, 0, 0, *sums, *sums, *[~s for s in low]], n) == i
    two = [0, 0, 0, *sums, sums[0], sums[1] + 5, sums[2] + 5, *[~s for s in sums]]
    assert differs(two, n) == 1  # the first of them


def test_free_ports_lie_outside_the_ephemeral_range_and_can_be_listened_on():
    """A port of the ephemeral range, free when picked, can become the local port of any outgoing
    connection before the group listens on it (EADDRINUSE, seen in a resumed run under Ray)."""
    import socket

    start = ephemeral_ports()[0]
    ports = [free_port() for _ in range(20)]
    assert all(20000 <= p < start for p in ports), ports
    assert len(set(ports)) >= 15  # picked at random, not the same few
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", ports[0]))
        s.listen()
