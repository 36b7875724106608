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

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from rlpost.weightsync.checksums import ReadBack, bucket_checksums
from rlpost.weightsync.manifest import Manifest, WeightSyncError
from rlpost.weightsync.packing import unpack
from rlpost.weightsync.plan import SyncPlan, received_plan, send_plan
from rlpost.weightsync.transport import SyncGroup
from rlpost.weightsync.verdict import HEAD, differs


@dataclass
class SyncStats:
    """What one side of one sync measured. It travels as it is, from the sender and each receiver
    to the controller, which alone turns it into metrics (`rlpost.controller.weights`)."""

    version: int
    bytes: int
    seconds: float
    tensors: int
    readback: int = 0  # tensors verified by reading them back from the engine (the rest: as received)
    header_s: float = 0.0  # of `seconds`: the header (and on a receiver its check), before any tensor
    verify_s: float = 0.0  # of `seconds`: after the last tensor was queued: read-back and verdict
    peak_bytes: int | None = None  # a sender on CUDA: device memory the export took beyond the trainer's own

    @staticmethod
    def of_shards(shards: list[SyncStats]) -> SyncStats:
        """One receiver's stats from those of its tensor-parallel shards (each received the whole
        sync): the slowest shard's times, the fewest tensors read back."""
        return SyncStats(
            shards[0].version,
            shards[0].bytes,
            max(s.seconds for s in shards),
            shards[0].tensors,
            min(s.readback for s in shards),
            max(s.header_s for s in shards),
            max(s.verify_s for s in shards),
        )


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
    plan = send_plan(manifest, bucket_bytes)
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
    _raise_on_sender(version, values, n, manifest)
    end = time.perf_counter()
    return SyncStats(version, sent, end - start, len(manifest), header_s=header_s, verify_s=end - sent_at)


def _raise_on_sender(version: int, values: list[int], n: int, manifest: Manifest) -> None:
    """The sender's error after the verdict: the rank or tensor at fault (its own error says more)."""
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
    plan = received_plan(header["plan"])
    problem = plan.check(expected)
    if problem is None and header["version"] != version:
        problem = f"sender is at version {header['version']}, this receiver expected {version}"
    header_s = time.perf_counter() - start
    manifest = plan.manifest
    verify = header["verify"] and not problem
    got = _Receipt(group, plan, verify, _parts(manifest, part) if verify else {})
    tensors = got.stream()
    if not problem:  # a refusing receiver loads nothing, but takes part in every transfer
        load(tensors)
    left = sum(1 for _ in tensors)  # drain what an engine left, so the sender does not stall
    skipped = (
        (f"weight sync v{version}: the engine loaded {len(manifest) - left} of {len(manifest)} tensors")
        if left and not problem
        else None
    )
    loaded_at = time.perf_counter()
    readback, mine, part_bad, wrong_parts = got.checked(loaded) if verify else (0, None, None, list)
    n = len(manifest) if header["verify"] else 0
    values = _verdict(group, group.rank if problem else 0, group.rank if skipped else 0, None, mine, n, part_bad)
    if problem:
        raise WeightSyncError(f"weight sync v{version} refused: {problem}")
    if skipped:
        raise WeightSyncError(skipped)
    _raise_on_receiver(version, values, n, manifest, mine, part_bad, wrong_parts)
    end = time.perf_counter()
    return SyncStats(version, got.received, end - start, len(manifest), readback, header_s, end - loaded_at)


@dataclass
class _Receipt:
    """One receiver's side of a sync: the buckets as they arrive, the checksums of what arrived
    (one vector per bucket, read back once at the end) and of the slices a shard keeps."""

    group: SyncGroup
    plan: SyncPlan
    verify: bool
    parts: dict  # manifest position -> (dim, start, length) of the slice the engine keeps
    received: int = 0
    sums: list = field(default_factory=list)
    part_sums: list = field(default_factory=list)

    def stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        plan, n = self.plan, len(self.plan.buckets)
        nxt = self.group.recv_bucket(plan.sizes[0], plan.dtypes[0]) if n else None
        for b in range(n):
            flat, pending = nxt
            pending.wait()  # then post the next one: it arrives while this one loads
            nxt = self.group.recv_bucket(plan.sizes[b + 1], plan.dtypes[b + 1]) if b + 1 < n else None
            self.received += sum(plan.numels[b]) * flat.element_size()
            if self.verify:
                self.sums.append(bucket_checksums(flat, plan.numels[b]))
            views = unpack(flat, plan.places[b])
            if self.parts:  # before the engine sees them
                mine = [v.narrow(*self.parts[i]) for i, v in zip(plan.buckets[b], views) if i in self.parts]
                self.part_sums.extend([ReadBack(mine)(mine)] if mine else [])
            for i, view in zip(plan.buckets[b], views):
                yield plan.manifest[i].name, view

    def checked(self, loaded) -> tuple:
        """(tensors read back, this rank's checksums of what it loaded, a device flag: a slice it
        keeps differs from what it received, a function naming those slices)."""
        manifest, parts = self.plan.manifest, self.parts
        parts_back, part_bad, wrong_parts = _check_parts(manifest, parts, self.part_sums, loaded)
        held = [None if i in parts else loaded(s.name) for i, s in enumerate(manifest)]
        back = [i for i, h in enumerate(held) if h is not None]
        if len(back) == len(manifest):  # what the engine holds
            return len(back), self.plan.read_back(held, back), part_bad, wrong_parts
        # as received, in manifest order (buckets hold consecutive tensors), then what it holds
        mine = torch.cat(self.sums) if self.sums else torch.zeros(0, dtype=torch.int64)
        if back:
            values = self.plan.read_back([held[i] for i in back], back).to(mine.device)
            mine[torch.tensor(back, device=mine.device)] = values
        return len(back) + parts_back, mine, part_bad, wrong_parts


def _raise_on_receiver(version, values, n, manifest, mine, part_bad, wrong_parts) -> None:
    """A receiver's error after the verdict: its own fault named first (a slice it keeps, a tensor
    it loaded), else the rank at fault."""
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
