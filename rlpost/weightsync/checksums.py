"""The checksums that verify a weight sync: of each bucket as it is sent and as it arrives, and
of what an engine holds after loading.

`checksum` reads a tensor's bytes (zero-padded to whole rows of 1 KiB) as 32-bit words, sums each
row modulo 2**32 and adds the row sums weighted by row number (1, 2, ...) in int64 wrapping
arithmetic. Integer addition is associative, so the value is the same on CPU and CUDA and for any
reduction order. Any changed bit changes it, and so does data moved from one row to another
(shifted, swapped matrix rows or heads, a wrong slice of a fused tensor, stale values); a
permutation inside one 1 KiB row does not. It reads the tensor once. Here it is torch ops: a
row-sum kernel and nine more for a whole bucket (`bucket_checksums`, of a bucket laid out by
`packing`), or for a `ReadBack` of many tensors; on CUDA one Triton kernel does the same where
the tensors lie (`cuda_checksums`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlpost.weightsync import cuda_checksums
from rlpost.weightsync.packing import ROW_BYTES, pack, padded, staged

_ROW_WORDS = ROW_BYTES // 4
_GROUP_BYTES = 64 << 20  # small separate tensors are copied together into groups this large
_ALONE_BYTES = 16 << 20  # larger ones are checksummed where they are
_ROW_NUMBERS: dict[torch.device, torch.Tensor] = {}  # 1, 2, 3, ... (int64), grown as needed
_BOUNDS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # see `_bounds`
_KERNELS: dict[tuple, "cuda_checksums.Checksums"] = {}  # see `_bucket_kernel`


def _row_sums(raw: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The sum of each row of the bytes `raw` (whole rows) read as 32-bit words, modulo 2**32 in
    int32: one read of the data at memory speed, no widened temporary."""
    try:
        words = raw.view(torch.int32)
    except RuntimeError:  # a view that starts off a 4-byte boundary
        words = raw.clone().view(torch.int32)
    return torch.sum(words.view(-1, _ROW_WORDS), 1, dtype=torch.int32, out=out)


def rows_of(numel: int, element_size: int) -> int:
    """The checksum rows a tensor takes in a bucket made by `pack`."""
    return padded(numel, element_size) * element_size // ROW_BYTES


def bucket_checksums(flat: torch.Tensor, numels: list[int]) -> torch.Tensor:
    """The checksums of the tensors of a bucket made by `pack` (their element counts `numels`), as
    an int64 vector on its device, with no host synchronisation: one kernel on CUDA
    (`cuda_checksums`), else a row sum and nine kernels."""
    size = flat.element_size()
    rows_each = tuple(rows_of(n, size) for n in numels)
    if cuda_checksums.available(flat.device) and flat.data_ptr() % 16 == 0:
        return _bucket_kernel(flat.device, rows_each)(flat.detach().reshape(-1).view(torch.uint8).view(torch.int32))
    rows = _row_sums(flat.detach().reshape(-1).view(torch.uint8))
    return checksums_of_rows(rows, rows_each)


def _bucket_kernel(device: torch.device, rows_each: tuple[int, ...]) -> cuda_checksums.Checksums:
    """The kernel's tables for a bucket whose tensors take `rows_each` rows (their padding is
    zeros), kept per bucket plan."""
    key = (device, rows_each)
    if key not in _KERNELS:
        if len(_KERNELS) > 1024:
            _KERNELS.clear()
        starts = [0]
        for r in rows_each[:-1]:
            starts.append(starts[-1] + r * ROW_BYTES)
        _KERNELS[key] = cuda_checksums.Checksums([r * ROW_BYTES for r in rows_each], device, starts)
    return _KERNELS[key]


def checksums_of_rows(rows: torch.Tensor, rows_each: tuple[int, ...]) -> torch.Tensor:
    """The checksums of consecutive tensors taking `rows_each` of the row sums `rows`. With R the
    row sums and rows [S_k, E_k) those of tensor k: sum_r (r + 1 - S_k) R_r =
    [sum_r (r + 1) R_r] - S_k [sum_r R_r], both differences of prefix sums."""
    n = rows.numel()
    # both prefix sums, each from 0, side by side; one-dimensional scans (a scan along the last
    # dimension of a [2, n] tensor runs on a handful of threads)
    prefix = torch.zeros(2 * (n + 1), dtype=torch.int64, device=rows.device)
    torch.cumsum(rows * _row_numbers(rows.device, n), 0, out=prefix[1 : n + 1])
    torch.cumsum(rows, 0, dtype=torch.int64, out=prefix[n + 2 :])
    index, starts = _bounds(rows.device, rows_each)
    ends, begins = prefix[index].view(2, 2, -1)  # each: [weighted, plain] at the tensors' ends / starts
    weighted, plain = ends - begins
    return weighted - starts * plain


def _row_numbers(device: torch.device, n: int) -> torch.Tensor:
    numbers = _ROW_NUMBERS.get(device)
    if numbers is None or numbers.numel() < n:
        numbers = _ROW_NUMBERS[device] = torch.arange(1, max(n, 1 << 16) + 1, dtype=torch.int64, device=device)
    return numbers[:n]


def _bounds(device: torch.device, rows_each: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(where `bucket_checksums` reads its prefix sums, the first row of each tensor) for a bucket
    whose tensors take `rows_each` rows, on `device`. Kept per bucket plan: a copy from the host
    would make the host wait for the device at every bucket of every sync."""
    key = (device, rows_each)
    if key not in _BOUNDS:
        if len(_BOUNDS) > 1024:
            _BOUNDS.clear()
        end = torch.tensor(rows_each, dtype=torch.int64).cumsum(0)
        start = end - torch.tensor(rows_each)
        plain = int(end[-1]) + 1 if len(rows_each) else 1  # where the plain prefix sums begin
        index = torch.cat([end, end + plain, start, start + plain])
        _BOUNDS[key] = (index.to(device), start.to(device))
    return _BOUNDS[key]


def checksums(tensors: list[torch.Tensor]) -> list[int]:
    """Checksums of separate tensors (any devices and dtypes), read back to the host once per
    device: a one-off `ReadBack` per device."""
    out: list[int] = [0] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for positions in by_device.values():
        mine = [tensors[i] for i in positions]
        for i, v in zip(positions, ReadBack(mine)(mine).tolist()):
            out[i] = v
    return out


def checksum(tensor: torch.Tensor) -> int:
    """The checksum of one tensor: equal bytes give equal values on every device."""
    return checksums([tensor])[0]


@dataclass
class _Group:
    """Tensors of a `ReadBack` copied together into the staging buffer at `views` (or one large
    tensor read where it is: `dtype` None), giving rows [first, first + rows)."""

    members: list[int]
    first: int
    rows: int
    dtype: torch.dtype | None = None
    views: list[torch.Tensor] | None = None
    pads: torch.Tensor | None = None  # staging elements that must be zero (the rows' tails)


class ReadBack:
    """`checksums` of tensors like `tensors` (same shapes, dtypes, one device, the same ones
    contiguous and aligned), taken again and again: what an engine holds, read back at every
    sync. On CUDA one kernel reads the contiguous, aligned tensors where they lie
    (`cuda_checksums`). The others are copied in groups into a staging buffer of up to
    `_GROUP_BYTES` (kept, with its views, between calls) or, when large, read alone; their row
    sums go into one vector and nine kernels make their checksums. A call does no per-tensor
    work but checks."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.device = tensors[0].device if tensors else torch.device("cpu")
        self.specs = [(t.shape, t.dtype) for t in tensors]
        fast = cuda_checksums.available(self.device)
        self.direct = [fast and cuda_checksums.direct(t) for t in tensors]
        self.in_place = [i for i, d in enumerate(self.direct) if d]
        self.rest = [i for i, d in enumerate(self.direct) if not d]
        numels = [t.numel() for t in tensors]
        self.rest_rows = tuple(rows_of(numels[i], self.specs[i][1].itemsize) for i in self.rest)
        self.groups: list[_Group] = []
        row, members, size = 0, [], 0  # rows go in tensor order: a group closes before the next one

        def close():
            nonlocal row, members, size
            if members:
                self.groups.append(_Group(members, row, size // ROW_BYTES, self.specs[members[0]][1]))
                row, members, size = row + size // ROW_BYTES, [], 0

        for i, rows in zip(self.rest, self.rest_rows):
            dtype = self.specs[i][1]
            if numels[i] * dtype.itemsize >= _ALONE_BYTES:
                close()
                self.groups.append(_Group([i], row, rows))
                row += rows
                continue
            if members and (size + rows * ROW_BYTES > _GROUP_BYTES or dtype != self.specs[members[0]][1]):
                close()
            members.append(i)
            size += rows * ROW_BYTES
        close()
        self.rows = row
        self.kernel = self.anchor = None
        if self.in_place:
            self.kernel = cuda_checksums.Checksums(
                [numels[i] * self.specs[i][1].itemsize for i in self.in_place], self.device
            )
            self.anchor = torch.zeros(4, dtype=torch.int32, device=self.device)  # the kernel's base
        mixed = self.in_place and self.rest
        self.in_place_index = torch.tensor(self.in_place, device=self.device) if mixed else None
        self.rest_index = torch.tensor(self.rest, device=self.device) if mixed else None
        most = max((g.rows for g in self.groups if g.dtype is not None), default=0)
        self.staging = torch.zeros(most * ROW_BYTES, dtype=torch.uint8, device=self.device)
        for g in self.groups:
            if g.dtype is not None:
                _, g.views, g.pads = staged(self.staging, [self.specs[i][0] for i in g.members], g.dtype)

    def matches(self, tensors: list[torch.Tensor]) -> bool:
        if len(tensors) != len(self.specs):
            return False
        if not all(t.dtype == d and t.shape == s and t.device == self.device for t, (s, d) in zip(tensors, self.specs)):
            return False
        return not self.in_place or all(cuda_checksums.direct(t) == d for t, d in zip(tensors, self.direct))

    def __call__(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The checksums of `tensors`, which must `match`, as an int64 vector on their device (no
        host synchronisation, unless the tensors moved since the last call)."""
        direct = None
        if self.kernel is not None:
            anchor = self.anchor.data_ptr()
            self.kernel.set_offsets([tensors[i].data_ptr() - anchor for i in self.in_place])
            direct = self.kernel(self.anchor)
            if not self.rest:
                return direct
        rows = torch.empty(self.rows, dtype=torch.int32, device=self.device)
        with torch.no_grad():
            for g in self.groups:
                out = rows[g.first : g.first + g.rows]
                if g.dtype is None:
                    _row_sums(pack([tensors[g.members[0]]], self.device).view(torch.uint8), out=out)
                    continue
                used = self.staging[: g.rows * ROW_BYTES]
                if g.pads is not None:
                    used.view(g.dtype).index_fill_(0, g.pads, 0)
                torch._foreach_copy_(g.views, [tensors[i] for i in g.members])
                _row_sums(used, out=out)
        copied = checksums_of_rows(rows, self.rest_rows)
        if direct is None:
            return copied
        out = torch.empty(len(self.specs), dtype=torch.int64, device=self.device)
        out.index_copy_(0, self.in_place_index, direct)
        return out.index_copy_(0, self.rest_index, copied)
