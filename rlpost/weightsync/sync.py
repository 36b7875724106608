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

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from rlpost.weightsync.manifest import (
    Manifest,
    WeightSyncError,
    bucket_checksums,
    checksums,
    compare_manifests,
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


def send_weights(group: SyncGroup, manifest: Manifest, tensors: Iterator[torch.Tensor],
                 version: int, bucket_bytes: int, verify: bool = True) -> SyncStats:
    """Send `tensors` (in manifest order, full unsharded values) to every receiver. A tensor may be
    sent from its own memory while the next ones are packed: it must not be written before this
    returns (the trainer's exports are fresh tensors)."""
    start = time.perf_counter()
    buckets = plan_buckets(manifest, bucket_bytes)
    group.broadcast_object({"version": version, "manifest": manifest, "buckets": buckets,
                            "verify": verify})
    refused = group.all_reduce_max(0)
    if refused:
        raise WeightSyncError(f"weight sync v{version}: rollout rank {refused} refused the manifest "
                              "(its error names the tensor)")
    sums: list[torch.Tensor] = []
    sent = 0
    in_flight = None  # the previous bucket's broadcast runs while this one is packed
    for bucket in buckets:
        parts = [next(tensors) for _ in bucket]
        dtype = getattr(torch, manifest[bucket[0]].dtype)
        for i, t in zip(bucket, parts):
            if tuple(t.shape) != manifest[i].shape or t.dtype != dtype:
                raise WeightSyncError(f"tensor {manifest[i].name!r} is {list(t.shape)} {t.dtype}, its "
                                      f"manifest says {list(manifest[i].shape)} {manifest[i].dtype}")
        flat = pack(parts, group.device)
        numels = [t.numel() for t in parts]
        if verify:
            sums.append(bucket_checksums(flat, numels))
        pending = group.send_bucket(flat)
        if in_flight is not None:
            in_flight.wait()
        in_flight = pending
        sent += sum(numels) * flat.element_size()
    if in_flight is not None:
        in_flight.wait()
    if verify:
        group.broadcast_object(torch.cat(sums).tolist() if sums else [])
        bad = group.all_reduce_max(0)
        if bad:
            raise WeightSyncError(f"weight sync v{version}: rollout rank {bad} loaded tensors whose "
                                  "checksum differs from the sent ones (its error names them)")
    return SyncStats(version, sent, time.perf_counter() - start, len(manifest))


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
    problem = compare_manifests(expected, header["manifest"])
    if problem is None and header["version"] != version:
        problem = f"sender is at version {header['version']}, this receiver expected {version}"
    group.all_reduce_max(group.rank if problem else 0)
    if problem:
        raise WeightSyncError(f"weight sync v{version} refused: {problem}")
    manifest: Manifest = header["manifest"]
    verify = header["verify"]
    received_sums: list[torch.Tensor] = []  # one vector per bucket, read back once at the end
    received = 0

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal received
        buckets = header["buckets"]

        def post(bucket):
            specs = [manifest[i] for i in bucket]
            dtype = getattr(torch, specs[0].dtype)
            numels = [torch.Size(s.shape).numel() for s in specs]
            return specs, numels, group.recv_bucket(sum(padded(n, dtype.itemsize) for n in numels), dtype)

        nxt = post(buckets[0]) if buckets else None
        for b in range(len(buckets)):
            specs, numels, (flat, pending) = nxt
            pending.wait()
            nxt = post(buckets[b + 1]) if b + 1 < len(buckets) else None  # arrives while this one loads
            received += sum(numels) * flat.element_size()
            if verify:
                received_sums.append(bucket_checksums(flat, numels))
            for s, v in zip(specs, unpack(flat, [s.shape for s in specs])):
                yield s.name, v

    tensors = stream()
    load(tensors)
    left = sum(1 for _ in tensors)  # drain what an engine left, so the sender does not stall
    skipped = (f"weight sync v{version}: the engine loaded {len(manifest) - left} of "
               f"{len(manifest)} tensors") if left else None
    readback = 0
    if verify:
        sent_sums = group.broadcast_object()
        held = [loaded(s.name) for s in manifest]
        # as received, in manifest order (buckets hold consecutive tensors); then what the engine holds
        mine = torch.cat(received_sums).tolist() if received_sums else []
        back = [i for i, h in enumerate(held) if h is not None]
        readback = len(back)
        for i, value in zip(back, checksums([held[i] for i in back])):
            mine[i] = value
        wrong = [s.name for s, ours, sent in zip(manifest, mine, sent_sums) if ours != sent]
        group.all_reduce_max(group.rank if wrong or skipped else 0)
        if wrong and not skipped:
            raise WeightSyncError(f"weight sync v{version}: checksum of loaded tensor {wrong[0]!r} "
                                  f"differs from the sender's ({len(wrong)} tensors differ)")
    if skipped:
        raise WeightSyncError(skipped)
    return SyncStats(version, received, time.perf_counter() - start, len(manifest), readback)

