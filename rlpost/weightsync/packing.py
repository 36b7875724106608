"""A bucket of a weight sync as it travels: one flat buffer of one dtype, each tensor starting on
a checksum row of `ROW_BYTES` and followed by the zeros that round it up to whole rows, so that
one pass over the bucket gives every tensor's checksum (`checksums.bucket_checksums`).

`pack` makes such a buffer (the sender); `layout` says where each tensor lies in it and `unpack`
gives the tensors back as views of it (the receiver); `staged` lays a bucket out in a buffer
kept between syncs, so that packing it is one copy and no allocation (the sender's staging
buffers in `plan`, the read-back's in `checksums`).
"""

from __future__ import annotations

import torch

ROW_BYTES = 1024  # bytes per row of the checksum; tensors in a bucket start on a row
_PADS: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}  # zeros of each length < a row


def padded(numel: int, element_size: int) -> int:
    """The elements a tensor takes in a bucket: its bytes rounded up to whole checksum rows."""
    per_row = ROW_BYTES // element_size
    return -(-numel // per_row) * per_row


def pack(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One flat bucket (one dtype) on `device`: each tensor followed by the zeros that round it to
    whole rows. A lone contiguous tensor already there that fills whole rows is used as it is."""
    first = tensors[0]
    if (
        len(tensors) == 1
        and first.device == device
        and first.is_contiguous()
        and padded(first.numel(), first.element_size()) == first.numel()
    ):
        return first.detach().view(-1)
    pads = _pads(device, first.dtype)
    per_row = len(pads)
    parts = []
    for t in tensors:
        parts.append(t if t.device == device else t.to(device))
        extra = -t.numel() % per_row
        if extra:
            parts.append(pads[extra])
    with torch.no_grad():  # one copy in C++: every part flattened and concatenated
        return torch._utils._flatten_dense_tensors(parts)


def _pads(device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """pads[k]: k zeros of `dtype` on `device` (k < elements per row)."""
    key = (device, dtype)
    if key not in _PADS:
        per_row = ROW_BYTES // dtype.itemsize
        zeros = torch.zeros(per_row, dtype=dtype, device=device)
        _PADS[key] = [zeros[:k] for k in range(per_row)]
    return _PADS[key]


def unpack(flat: torch.Tensor, places: list[tuple[tuple, tuple, int]]) -> list[torch.Tensor]:
    """The tensors of a bucket made by `pack`, as views of `flat`; `places` is its `layout`."""
    base = flat.storage_offset()
    return [flat.as_strided(shape, strides, base + offset) for shape, strides, offset in places]


def layout(shapes: list[tuple[int, ...]], element_size: int) -> list[tuple[tuple, tuple, int]]:
    """(shape, contiguous strides, offset in elements) of each tensor of a bucket made by `pack`."""
    out, offset = [], 0
    for shape in shapes:
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= size
        out.append((tuple(shape), tuple(reversed(strides)), offset))
        offset += padded(step, element_size)
    return out


def staged(buffer: torch.Tensor, shapes: list[tuple[int, ...]], dtype: torch.dtype) -> tuple:
    """A bucket laid out as `pack` lays it out in `buffer` (bytes, kept by the caller): (its flat
    view, a view per tensor, the positions of its padding, None if none). Copying into the views
    and zeroing the padding packs it with no allocation; another layout may have written there."""
    places = layout(shapes, dtype.itemsize)
    numels = [torch.Size(s).numel() for s in shapes]
    size = places[-1][2] + padded(numels[-1], dtype.itemsize) if places else 0
    flat = buffer[: size * dtype.itemsize].view(dtype)
    tails = [torch.arange(at + n, at + padded(n, dtype.itemsize)) for n, (_, _, at) in zip(numels, places)]
    tails = [t for t in tails if t.numel()]
    return flat, unpack(flat, places), torch.cat(tails).to(buffer.device) if tails else None
