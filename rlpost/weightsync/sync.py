"""One weight sync: trainer rank 0 sends, every rollout actor receives and verifies.

Protocol (all over the `SyncGroup`, sender = rank 0), two control messages per sync:
1. header (one broadcast): version, manifest (names, shapes, dtypes) and bucket plan;
2. the tensors, bucket by bucket, each bucket one flat buffer of one dtype. A receiver whose
   manifest or version disagrees with the header receives them without loading anything;
3. the verdict (one all-reduce, MAX): which rank refused the header, which engine loaded fewer
   tensors than were sent, which holds a part of a tensor other than the one it received and,
   when verified, the sender's checksums and the highest and lowest checksum of each tensor over
   all ranks. Each receiver checks what it *loaded* against the sender's; every rank sees whether
   any rank differs, so a failure is an error on every rank (the receiver at fault names the
   tensor). A receiver that holds only part of a tensor (a tensor-parallel shard) checks the
   tensor as received against the sender's, and the part it holds against that part of what it
   received.
The sender never waits for the receivers before the data moves: a refusal costs a transfer,
a sync that is accepted costs no round trip more than the data.
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
    layout,
    pack,
    padded,
    plan_buckets,
    staged,
    unpack,
)
from rlpost.weightsync.transport import SyncGroup
from rlpost.weightsync.verdict import HEAD, compare_manifests, differs


@dataclass
class SyncStats:
    version: int
    bytes: int
    seconds: float
    tensors: int
    readback: int = 0  # tensors verified by reading them back from the engine (the rest: as received)
    header_s: float = 0.0  # of `seconds`: the header (and on a receiver its check), before any tensor
    verify_s: float = 0.0  # of `seconds`: after the last tensor was queued: read-back and verdict


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
    staging: dict = field(default_factory=dict)  # sender: device -> per bucket (flat, views, pads)

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
        """The checksums of what an engine holds for the manifest's tensors at `positions`, as a
        vector on their device: with a `ReadBack` kept for the next sync where they are on one
        device (as engines hold them), else with `checksums`."""
        with self.lock:  # one staging buffer: one read-back at a time (queued in order on a GPU)
            if self.reader and self.reader[0] == positions and self.reader[1].matches(tensors):
                return self.reader[1](tensors)
            if len({t.device for t in tensors}) == 1:
                self.reader = (positions, ReadBack(tensors))
                return self.reader[1](tensors)
        return torch.tensor(checksums(tensors), dtype=torch.int64)

    def pack(self, b: int, parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """Bucket `b` as one flat tensor on `device`, laid out as `manifest.pack` lays it out. A
        bucket of one tensor that fills whole rows goes through `pack` (as it is where it can);
        the others are copied (one `_foreach_copy_`) into one of two staging buffers kept with
        the plan: bucket b into buffer b % 2, whose previous bucket's broadcast the sender has
        waited for (stream order)."""
        if self._lone(b):
            return pack(parts, device)
        if device not in self.staging:
            nbytes = max(
                (self.sizes[i] * self.dtypes[i].itemsize for i in range(len(self.buckets)) if not self._lone(i)),
                default=0,
            )
            buffers = [torch.zeros(nbytes, dtype=torch.uint8, device=device) for _ in range(2)]
            self.staging[device] = [
                None
                if self._lone(i)
                else staged(buffers[i % 2], [self.manifest[j].shape for j in bucket], self.dtypes[i])
                for i, bucket in enumerate(self.buckets)
            ]
        flat, views, pads = self.staging[device][b]
        with torch.no_grad():
            if pads is not None:
                flat.index_fill_(0, pads, 0)
            torch._foreach_copy_(views, parts)
        return flat

    def _lone(self, b: int) -> bool:
        """Bucket `b` is one tensor that fills whole rows: it needs no staging."""
        return len(self.buckets[b]) == 1 and self.numels[b][0] == self.sizes[b]

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


_LOWEST = -(2**63)  # neutral in a MAX all-reduce


def _verdict(
    group: SyncGroup,
    refused: int,
    short: int,
    sent: torch.Tensor | None,
    mine: torch.Tensor | None,
    n: int,
    part: torch.Tensor | None = None,
) -> list[int]:
    """The closing all-reduce. Each rank gives [rank that refused the header, rank whose engine
    loaded less, rank that holds a wrong part (`part`: a device flag), the sender's checksums, its
    own checksums, their bitwise complements] (the last three only for a verified sync of `n`
    tensors, `_LOWEST` where a rank has nothing to say); every rank gets [refused, short, part,
    sent, highest, ~lowest]. Built where it is reduced, with no wait for the device before the
    all-reduce is queued."""
    values = torch.full((HEAD + 3 * n,), _LOWEST, dtype=torch.int64, device=group.control)
    values[0].fill_(refused)
    values[1].fill_(short)
    values[2].fill_(0)
    if part is not None:
        values[2].copy_(part.to(values.device) * group.rank)
    if sent is not None:
        values[HEAD : HEAD + n].copy_(sent)
    if mine is not None:
        values[HEAD + n : HEAD + 2 * n].copy_(mine)
        torch.bitwise_not(values[HEAD + n : HEAD + 2 * n], out=values[HEAD + 2 * n :])
    group.all_reduce_max_(values)
    return values.tolist()


def send_weights(
    group: SyncGroup,
    manifest: Manifest,
    tensors: Iterator[torch.Tensor],
    version: int,
    bucket_bytes: int,
    verify: bool = True,
) -> SyncStats:
    """Send `tensors` (in manifest order, full unsharded values) to every receiver. A tensor may be
    sent from its own memory while the next ones are packed: it must not be written before this
    returns (the trainer's exports are fresh tensors)."""
    start = time.perf_counter()
    plan = _send_plan(manifest, bucket_bytes)
    group.broadcast_object({"version": version, "plan": plan.wire, "verify": verify})
    header_s = time.perf_counter() - start
    sums: list[torch.Tensor] = []
    sent = 0
    in_flight = None  # the previous bucket's broadcast runs while this one is gathered and packed
    for b, bucket in enumerate(plan.buckets):
        parts = [next(tensors) for _ in bucket]
        dtype = plan.dtypes[b]
        for i, t, (shape, _, _) in zip(bucket, parts, plan.places[b]):
            if t.shape != shape or t.dtype != dtype:
                raise WeightSyncError(
                    f"tensor {manifest[i].name!r} is {list(t.shape)} {t.dtype}, its "
                    f"manifest says {list(shape)} {manifest[i].dtype}"
                )
        flat = plan.pack(b, parts, group.device)
        if in_flight is not None:  # one transfer at a time, as receivers post them
            in_flight.wait()
        in_flight = group.send_bucket(flat)
        if verify:  # after the send is queued: the broadcast does not wait for the checksum
            sums.append(bucket_checksums(flat, plan.numels[b]))
        sent += sum(plan.numels[b]) * dtype.itemsize
    if in_flight is not None:
        in_flight.wait()
    sent_at = time.perf_counter()
    n = len(manifest) if verify else 0
    mine = torch.cat(sums) if sums else None
    values = _verdict(group, 0, 0, mine, mine, n)
    if values[0]:
        raise WeightSyncError(
            f"weight sync v{version}: rollout rank {values[0]} refused the header "
            "(its error names the tensor or the version)"
        )
    if values[1]:
        raise WeightSyncError(
            f"weight sync v{version}: the engine of rollout rank {values[1]} loaded "
            "fewer tensors than were sent (its error says how many)"
        )
    if values[2]:
        raise WeightSyncError(
            f"weight sync v{version}: rollout rank {values[2]} holds a part of a tensor that differs "
            "from that part of what it received (its error names the tensor)"
        )
    wrong = differs(values, n)
    if wrong is not None:
        raise WeightSyncError(
            f"weight sync v{version}: a rollout rank loaded tensor "
            f"{manifest[wrong].name!r} with a checksum that differs from the sent one "
            "(that rank's error names every such tensor)"
        )
    end = time.perf_counter()
    return SyncStats(version, sent, end - start, len(manifest), header_s=header_s, verify_s=end - sent_at)


def receive_weights(
    group: SyncGroup,
    expected: Manifest,
    version: int,
    load: Callable[[Iterator[tuple[str, torch.Tensor]]], None],
    loaded: Callable[[str], torch.Tensor | None],
    part: Callable[[str], tuple[int, int, int] | None] | None = None,
) -> SyncStats:
    """Receive one sync. `load(named_tensors)` consumes an iterator of (name, tensor) that
    receives bucket by bucket as it is read (an engine can stream it into its own loader; only
    one bucket is in memory at a time). `loaded(name)` returns the tensor the engine now holds
    under `name` for the checksum, or None where the engine keeps it in another layout (fused or
    repacked kernels): then the checksum of the received bytes stands in for it. `part(name)`:
    (dim, start, length) of tensor `name` where the engine holds only that slice of it (a
    tensor-parallel shard; then `loaded` returns the slice), None where it holds all of it."""
    start = time.perf_counter()
    header = group.broadcast_object()
    plan = _received_plan(header["plan"])
    problem = plan.check(expected)
    if problem is None and header["version"] != version:
        problem = f"sender is at version {header['version']}, this receiver expected {version}"
    header_s = time.perf_counter() - start
    manifest = plan.manifest
    verify = header["verify"] and not problem
    received_sums: list[torch.Tensor] = []  # one vector per bucket, read back once at the end
    received = 0
    parts = _parts(manifest, part) if verify else {}
    part_sums: list[torch.Tensor] = []  # of the received slices a shard holds, bucket by bucket

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
            views = unpack(flat, plan.places[b])
            if parts:  # before the engine sees them
                mine = [v.narrow(*parts[i]) for i, v in zip(plan.buckets[b], views) if i in parts]
                part_sums.extend([ReadBack(mine)(mine)] if mine else [])
            for i, view in zip(plan.buckets[b], views):
                yield manifest[i].name, view

    tensors = stream()
    if not problem:  # a refusing receiver loads nothing, but takes part in every transfer
        load(tensors)
    left = sum(1 for _ in tensors)  # drain what an engine left, so the sender does not stall
    skipped = (
        (f"weight sync v{version}: the engine loaded {len(manifest) - left} of {len(manifest)} tensors")
        if left and not problem
        else None
    )
    readback = 0
    loaded_at = time.perf_counter()
    mine = None
    parts_back, part_bad, wrong_parts = 0, None, list
    if verify:
        parts_back, part_bad, wrong_parts = _check_parts(manifest, parts, part_sums, loaded)
        held = [None if i in parts else loaded(s.name) for i, s in enumerate(manifest)]
        back = [i for i, h in enumerate(held) if h is not None]
        readback = len(back) + parts_back
        if len(back) == len(manifest):  # what the engine holds
            mine = plan.read_back(held, back)
        else:  # as received, in manifest order (buckets hold consecutive tensors), then what it holds
            mine = torch.cat(received_sums) if received_sums else torch.zeros(0, dtype=torch.int64)
            if back:
                values = plan.read_back([held[i] for i in back], back).to(mine.device)
                mine[torch.tensor(back, device=mine.device)] = values
    n = len(manifest) if header["verify"] else 0
    values = _verdict(group, group.rank if problem else 0, group.rank if skipped else 0, None, mine, n, part_bad)
    if problem:
        raise WeightSyncError(f"weight sync v{version} refused: {problem}")
    if skipped:
        raise WeightSyncError(skipped)
    if part_bad is not None and part_bad.item():  # after the verdict's read: no wait of its own
        wrong = wrong_parts()
        raise WeightSyncError(
            f"weight sync v{version}: the part this shard holds of tensor {wrong[0]!r} differs from "
            f"that part of what it received ({len(wrong)} tensors differ)"
        )
    first_differing = differs(values, n)
    if first_differing is not None and mine is not None:  # all agree with the sender unless some differ
        sent = values[HEAD : HEAD + n]
        wrong = [s.name for s, got, want in zip(manifest, mine.tolist(), sent) if got != want]
        if wrong:
            raise WeightSyncError(
                f"weight sync v{version}: checksum of loaded tensor {wrong[0]!r} "
                f"differs from the sender's ({len(wrong)} tensors differ)"
            )
    if values[0] or values[1] or values[2] or first_differing is not None:
        raise WeightSyncError(
            f"weight sync v{version} failed on rollout rank "
            f"{values[0] or values[1] or values[2] or 'another'} (its error says why); this rank "
            f"loaded every tensor{' intact' if mine is not None else ''}"
        )
    end = time.perf_counter()
    return SyncStats(version, received, end - start, len(manifest), readback, header_s, end - loaded_at)


def _parts(manifest: Manifest, part) -> dict[int, tuple[int, int, int]]:
    """Manifest position -> (dim, start, length) of each tensor the engine holds a slice of."""
    if part is None:
        return {}
    found = {i: part(s.name) for i, s in enumerate(manifest)}
    return {i: p for i, p in found.items() if p is not None}


def _check_parts(manifest: Manifest, parts: dict, part_sums: list[torch.Tensor], loaded) -> tuple:
    """The slices a shard holds against those slices of what it received: (how many were read
    back, a device flag: any differs, a function naming those that differ). None for both where
    there is nothing to check; the names need the host, so only a rank at fault asks for them."""
    if not parts:
        return 0, None, list
    positions = sorted(parts)
    held = [loaded(manifest[i].name) for i in positions]
    back = [k for k, h in enumerate(held) if h is not None]  # the rest: in a layout not read back
    if not back:
        return 0, None, list
    want = torch.cat(part_sums)
    got = ReadBack([held[k] for k in back])([held[k] for k in back]).to(want.device)
    bad = got != want[torch.tensor(back, device=want.device)]
    return (
        len(back),
        bad.any().to(torch.int64),
        lambda: [manifest[positions[back[k]]].name for k in bad.nonzero()[:, 0].tolist()],
    )
