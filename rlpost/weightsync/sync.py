"""One weight sync: trainer rank 0 sends, every rollout actor receives and verifies.

Protocol (all over the `SyncGroup`, sender = rank 0):
1. header: version, manifest (names, shapes, dtypes) and bucket plan;
2. every receiver compares the manifest with its own and the version with the one it expects;
   an all-reduce tells everyone if any receiver refused (the receiver's error names the tensor);
3. the tensors, bucket by bucket, each bucket one flat buffer of one dtype;
4. the sender's checksums; each receiver checksums what it *loaded* and compares; a second
   all-reduce makes a mismatch an error on every rank.
"""

from __future__ import annotations

import operator
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from rlpost.weightsync.manifest import (
    Manifest,
    ReadBack,
    WeightSyncError,
    bucket_checksums,
    checksums,
    compare_manifests,
    layout,
    pack,
    padded,
    plan_buckets,
    unpack,
)
from rlpost.weightsync.transport import SyncGroup


@dataclass
class SyncStats:
    version: int
    bytes: int
    seconds: float
    tensors: int
    readback: int = 0  # tensors verified by reading them back from the engine (the rest: as received)
    header_s: float = 0.0  # of `seconds`: the header and the manifest check, before any tensor moved
    verify_s: float = 0.0  # of `seconds`: the checksums' exchange and check, after the last tensor


@dataclass
class _Plan:
    """What a manifest and a bucket size decide, worked out once and reused by every sync that
    sends the same manifest (the per-sync work is then the data, not Python over 300 tensors)."""
    manifest: Manifest
    buckets: list[list[int]]
    wire: bytes  # (manifest, buckets) pickled: what the header carries
    dtypes: list[torch.dtype] = field(default_factory=list)
    numels: list[list[int]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # elements of each bucket on the wire
    places: list[list[tuple]] = field(default_factory=list)  # `layout` of each bucket
    accepted: tuple = ()  # the receiver's manifest this plan was found to match
    reader: tuple = ()  # (positions, ReadBack) of the last read-back
    lock: threading.Lock = field(default_factory=threading.Lock)  # receivers in threads share the plan

    def __post_init__(self):
        for bucket in self.buckets:
            specs = [self.manifest[i] for i in bucket]
            dtype = getattr(torch, specs[0].dtype)
            shapes = [s.shape for s in specs]
            numels = [torch.Size(s).numel() for s in shapes]
            self.dtypes.append(dtype)
            self.numels.append(numels)
            self.sizes.append(sum(padded(n, dtype.itemsize) for n in numels))
            self.places.append(layout(shapes, dtype.itemsize))

    def read_back(self, tensors: list[torch.Tensor], positions: list[int]) -> torch.Tensor:
        """The checksums of what an engine holds for the manifest's tensors at `positions`: with a
        `ReadBack` kept for the next sync where they are on one device in the manifest's shapes
        and dtypes (as engines hold them), else with `checksums`."""
        with self.lock:  # one staging buffer: one read-back at a time (queued in order on a GPU)
            if self.reader and self.reader[0] == positions and self.reader[1].matches(tensors):
                return self.reader[1](tensors)
            specs = [(self.manifest[i].shape, getattr(torch, self.manifest[i].dtype)) for i in positions]
            devices = {t.device for t in tensors}
            if len(devices) == 1:
                reader = ReadBack(specs, devices.pop())
                if reader.matches(tensors):
                    self.reader = (positions, reader)
                    return reader(tensors)
        return torch.tensor(checksums(tensors), dtype=torch.int64)

    def check(self, expected: Manifest) -> str | None:
        """compare_manifests(expected, sent), remembered once it passed for these very specs."""
        if len(self.accepted) == len(expected) and all(map(operator.is_, self.accepted, expected)):
            return None
        problem = compare_manifests(expected, self.manifest)
        if problem is None:
            self.accepted = tuple(expected)
        return problem


_SENT: dict[tuple[int, int], tuple[tuple, _Plan]] = {}  # (id(manifest), bucket bytes) -> (its specs, plan)
_RECEIVED: dict[bytes, _Plan] = {}  # a header's plan bytes -> plan


def _send_plan(manifest: Manifest, bucket_bytes: int) -> _Plan:
    key = (id(manifest), bucket_bytes)
    snapshot, plan = _SENT.get(key, ((), None))
    if plan is None or len(snapshot) != len(manifest) or not all(map(operator.is_, snapshot, manifest)):
        if len(_SENT) > 16:
            _SENT.clear()
        buckets = plan_buckets(manifest, bucket_bytes)
        plan = _Plan(list(manifest), buckets, pickle.dumps((list(manifest), buckets)))
        _SENT[key] = (tuple(manifest), plan)
    return plan


def _received_plan(wire: bytes) -> _Plan:
    plan = _RECEIVED.get(wire)
    if plan is None:
        if len(_RECEIVED) > 16:
            _RECEIVED.clear()
        plan = _RECEIVED[wire] = _Plan(*pickle.loads(wire), wire)
    return plan


def send_weights(group: SyncGroup, manifest: Manifest, tensors: Iterator[torch.Tensor],
                 version: int, bucket_bytes: int, verify: bool = True) -> SyncStats:
    """Send `tensors` (in manifest order, full unsharded values) to every receiver. A tensor may be
    sent from its own memory while the next ones are packed: it must not be written before this
    returns (the trainer's exports are fresh tensors)."""
    start = time.perf_counter()
    plan = _send_plan(manifest, bucket_bytes)
    group.broadcast_object({"version": version, "plan": plan.wire, "verify": verify})
    refused = group.all_reduce_max(0)
    if refused:
        raise WeightSyncError(f"weight sync v{version}: rollout rank {refused} refused the manifest "
                              "(its error names the tensor)")
    header_s = time.perf_counter() - start
    sums: list[torch.Tensor] = []
    sent = 0
    in_flight = None  # the previous bucket's broadcast runs while this one is packed
    for b, bucket in enumerate(plan.buckets):
        parts = [next(tensors) for _ in bucket]
        dtype = plan.dtypes[b]
        for i, t, (shape, _, _) in zip(bucket, parts, plan.places[b]):
            if t.shape != shape or t.dtype != dtype:
                raise WeightSyncError(f"tensor {manifest[i].name!r} is {list(t.shape)} {t.dtype}, its "
                                      f"manifest says {list(shape)} {manifest[i].dtype}")
        flat = pack(parts, group.device)
        pending = group.send_bucket(flat)
        if verify:  # after the send is queued: the broadcast does not wait for the checksum
            sums.append(bucket_checksums(flat, plan.numels[b]))
        if in_flight is not None:
            in_flight.wait()
        in_flight = pending
        sent += sum(plan.numels[b]) * dtype.itemsize
    if in_flight is not None:
        in_flight.wait()
    sent_at = time.perf_counter()
    if verify:
        values = torch.cat(sums) if sums else torch.zeros(0, dtype=torch.int64)
        group.broadcast(values.to(group.control))
        bad = group.all_reduce_max(0)
        if bad:
            raise WeightSyncError(f"weight sync v{version}: rollout rank {bad} loaded tensors whose "
                                  "checksum differs from the sent ones (its error names them)")
    end = time.perf_counter()
    return SyncStats(version, sent, end - start, len(manifest), header_s=header_s, verify_s=end - sent_at)


def receive_weights(group: SyncGroup, expected: Manifest, version: int,
                    load: Callable[[Iterator[tuple[str, torch.Tensor]]], None],
                    loaded: Callable[[str], torch.Tensor | None]) -> SyncStats:
    """Receive one sync. `load(named_tensors)` consumes an iterator of (name, tensor) that
    receives bucket by bucket as it is read (an engine can stream it into its own loader; only
    one bucket is in memory at a time). `loaded(name)` returns the tensor the engine now holds
    under `name` for the checksum, or None where the engine keeps it in another layout (fused or
    repacked kernels): then the checksum of the received bytes stands in for it."""
    start = time.perf_counter()
    header = group.broadcast_object()
    plan = _received_plan(header["plan"])
    problem = plan.check(expected)
    if problem is None and header["version"] != version:
        problem = f"sender is at version {header['version']}, this receiver expected {version}"
    group.all_reduce_max(group.rank if problem else 0)
    if problem:
        raise WeightSyncError(f"weight sync v{version} refused: {problem}")
    header_s = time.perf_counter() - start
    manifest = plan.manifest
    verify = header["verify"]
    received_sums: list[torch.Tensor] = []  # one vector per bucket, read back once at the end
    received = 0

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal received
        n = len(plan.buckets)
        nxt = group.recv_bucket(plan.sizes[0], plan.dtypes[0]) if n else None
        for b in range(n):
            flat, pending = nxt
            pending.wait()  # then post the next one: it arrives while this one loads
            nxt = group.recv_bucket(plan.sizes[b + 1], plan.dtypes[b + 1]) if b + 1 < n else None
            received += sum(plan.numels[b]) * flat.element_size()
            if verify:
                received_sums.append(bucket_checksums(flat, plan.numels[b]))
            for i, view in zip(plan.buckets[b], unpack(flat, plan.places[b])):
                yield manifest[i].name, view

    tensors = stream()
    load(tensors)
    left = sum(1 for _ in tensors)  # drain what an engine left, so the sender does not stall
    skipped = (f"weight sync v{version}: the engine loaded {len(manifest) - left} of "
               f"{len(manifest)} tensors") if left else None
    readback = 0
    loaded_at = time.perf_counter()
    if verify:
        held = [loaded(s.name) for s in manifest]
        back = [i for i, h in enumerate(held) if h is not None]
        readback = len(back)
        back_sums = plan.read_back([held[i] for i in back], back)  # queued before anything waits
        sent_sums = group.broadcast(torch.empty(len(manifest), dtype=torch.int64, device=group.control)).tolist()
        # as received, in manifest order (buckets hold consecutive tensors); then what the engine holds
        mine = torch.cat(received_sums).tolist() if received_sums else []
        for i, value in zip(back, back_sums.tolist()):
            mine[i] = value
        wrong = [s.name for s, got, sent in zip(manifest, mine, sent_sums) if got != sent]
        group.all_reduce_max(group.rank if wrong or skipped else 0)
        if wrong and not skipped:
            raise WeightSyncError(f"weight sync v{version}: checksum of loaded tensor {wrong[0]!r} "
                                  f"differs from the sender's ({len(wrong)} tensors differ)")
    if skipped:
        raise WeightSyncError(skipped)
    end = time.perf_counter()
    return SyncStats(version, received, end - start, len(manifest), readback, header_s, end - loaded_at)
