"""What a weight sync carries, described before it is sent, and how it is checked after.

A `Manifest` lists every tensor (name, shape, dtype) in send order. Sender and receiver compare
manifests before any tensor moves: a collective over mismatched shapes would otherwise abort the
process inside gloo/NCCL with no hint of which tensor was wrong.

`checksum` reads a tensor's bytes (zero-padded to whole rows of 1 KiB) as 32-bit words, sums each
row modulo 2**32 and adds the row sums weighted by row number (1, 2, ...) in int64 wrapping
arithmetic. Integer addition
is associative, so the value is the same on CPU and CUDA and for any reduction order. Any changed
bit changes it, and so does data moved from one row to another (shifted, swapped matrix rows or
heads, a wrong slice of a fused tensor, stale values); a permutation inside one 1 KiB row does not.
It reads the tensor once (rows of 1 KiB let CUDA's reduction run at memory speed) and works on
1/128 of its size after that; a whole bucket of tensors is checksummed in a fixed number of kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class WeightSyncError(RuntimeError):
    """A weight sync failed verification: names the tensor or rank at fault."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * getattr(torch, self.dtype).itemsize


Manifest = list[TensorSpec]


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))


def manifest_of(named_tensors) -> Manifest:
    return [spec_of(name, t) for name, t in named_tensors]


def compare_manifests(expected: Manifest, received: Manifest) -> str | None:
    """None if they agree, else a message naming the first tensor that differs."""
    exp = {s.name: s for s in expected}
    rec = {s.name: s for s in received}
    missing = [n for n in exp if n not in rec]
    extra = [n for n in rec if n not in exp]
    if missing:
        return f"tensor {missing[0]!r} is expected but not sent ({len(missing)} missing)"
    if extra:
        return f"tensor {extra[0]!r} is sent but the receiver has no such tensor ({len(extra)} unknown)"
    for s in received:
        e = exp[s.name]
        if (e.shape, e.dtype) != (s.shape, s.dtype):
            return (f"tensor {s.name!r}: sent shape {list(s.shape)} {s.dtype}, "
                    f"receiver has {list(e.shape)} {e.dtype}")
    return None


def plan_buckets(manifest: Manifest, bucket_bytes: int) -> list[list[int]]:
    """Group consecutive tensors of one dtype into buckets of at most `bucket_bytes`
    (a larger tensor travels alone)."""
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i, spec in enumerate(manifest):
        if buckets and spec.dtype == dtype and size + spec.nbytes <= bucket_bytes:
            buckets[-1].append(i)
            size += spec.nbytes
        else:
            buckets.append([i])
            size, dtype = spec.nbytes, spec.dtype
    return buckets


ROW_BYTES = 1024  # bytes per row of the checksum; tensors in a bucket start on a row
_ROW_WORDS = ROW_BYTES // 4
_GROUP_BYTES = 64 << 20  # small separate tensors are copied together into groups this large
_ALONE_BYTES = 16 << 20  # larger ones are checksummed where they are
_ZEROS: dict[torch.device, torch.Tensor] = {}
_BOUNDS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (device, rows of each) -> (start, end)


def padded(numel: int, element_size: int) -> int:
    """The elements a tensor takes in a bucket: its bytes rounded up to whole checksum rows."""
    per_row = ROW_BYTES // element_size
    return -(-numel // per_row) * per_row


def pack(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One flat bucket (one dtype) on `device`: each tensor followed by the zeros that round it to
    whole rows. A lone contiguous tensor already there that fills whole rows is used as it is."""
    first = tensors[0]
    if (len(tensors) == 1 and first.device == device and first.is_contiguous()
            and padded(first.numel(), first.element_size()) == first.numel()):
        return first.detach().view(-1)
    zeros = _ZEROS.get(device)
    if zeros is None:
        zeros = _ZEROS[device] = torch.zeros(ROW_BYTES, dtype=torch.uint8, device=device)
    parts = []
    size = first.element_size()
    per_row = ROW_BYTES // size
    with torch.no_grad():
        for t in tensors:
            flat = t.view(-1) if t.is_contiguous() else t.reshape(-1)
            parts.append(flat if flat.device == device else flat.to(device))
            extra = -t.numel() % per_row
            if extra:
                parts.append(zeros[:extra * size].view(t.dtype))
        return torch.cat(parts)


def unpack(flat: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """The tensors of a bucket made by `pack`, as views of `flat`."""
    views, offset = [], flat.storage_offset()
    for shape in shapes:
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= size
        views.append(flat.as_strided(shape, tuple(reversed(strides)), offset))
        offset += padded(step, flat.element_size())
    return views


def _row_sums(raw: torch.Tensor) -> torch.Tensor:
    """int64 sum of each row of the bytes `raw` (whole rows) read as 32-bit words, summed modulo
    2**32 in int32: one read of the data at memory speed, no widened temporary."""
    try:
        words = raw.view(torch.int32)
    except RuntimeError:  # a view that starts off a 4-byte boundary
        words = raw.clone().view(torch.int32)
    return words.view(-1, _ROW_WORDS).sum(1, dtype=torch.int32).to(torch.int64)


def bucket_checksums(flat: torch.Tensor, numels: list[int]) -> torch.Tensor:
    """The checksums of the tensors of a bucket made by `pack` (their element counts `numels`), as
    an int64 vector on its device, in a fixed number of kernels and no host synchronisation. With
    R the row sums and S_k the first row of tensor k: sum_r (r + 1 - S_k) R_r =
    [sum_r (r + 1) R_r] - S_k [sum_r R_r], both read off prefix sums."""
    size = flat.element_size()
    rows_each = [padded(n, size) * size // ROW_BYTES for n in numels]
    rows = _row_sums(flat.detach().reshape(-1).view(torch.uint8))
    index = torch.arange(1, rows.numel() + 1, dtype=torch.int64, device=flat.device)
    zero = rows.new_zeros(1)
    weighted = torch.cat([zero, (rows * index).cumsum(0)])
    plain = torch.cat([zero, rows.cumsum(0)])
    start, end = _bounds(flat.device, rows_each)
    return (weighted[end] - weighted[start]) - start * (plain[end] - plain[start])


def _bounds(device: torch.device, rows_each: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """First and one-past-last row of each tensor, on `device`. Kept per bucket plan: a copy from
    the host would make the host wait for the device at every bucket of every sync."""
    key = (device, tuple(rows_each))
    if key not in _BOUNDS:
        if len(_BOUNDS) > 1024:
            _BOUNDS.clear()
        end = torch.tensor(rows_each, dtype=torch.int64).cumsum(0)
        _BOUNDS[key] = ((end - torch.tensor(rows_each)).to(device), end.to(device))
    return _BOUNDS[key]


def checksums(tensors: list[torch.Tensor]) -> list[int]:
    """Checksums of separate tensors (any devices), read back to the host once per device. Small
    tensors are copied together into groups (a few kernels per group, not per tensor); large ones
    are read where they are."""
    out: list[int] = [0] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for device, positions in by_device.items():
        order: list[int] = []  # the tensor index of each value in `parts`, in order
        parts: list[torch.Tensor] = []
        group: list[int] = []

        def flush():
            if group:
                members = [tensors[i].detach().reshape(-1).view(torch.uint8) for i in group]
                parts.append(bucket_checksums(pack(members, device), [m.numel() for m in members]))
                order.extend(group)
                group.clear()

        size = 0
        for i in positions:
            t = tensors[i].detach()
            nbytes = t.numel() * t.element_size()
            if nbytes >= _ALONE_BYTES:
                parts.append(bucket_checksums(pack([t.contiguous()], device), [t.numel()]))
                order.append(i)
                continue
            if size + nbytes > _GROUP_BYTES:
                flush()
                size = 0
            group.append(i)
            size += nbytes
        flush()
        for i, v in zip(order, torch.cat(parts).tolist()):
            out[i] = v
    return out


def checksum(tensor: torch.Tensor) -> int:
    """The checksum of one tensor: equal bytes give equal values on every device."""
    return checksums([tensor])[0]
