"""What a weight sync carries, described before it is sent, and how it is checked after.

A `Manifest` lists every tensor (name, shape, dtype) in send order. Sender and receiver compare
manifests before any tensor moves: a collective over mismatched shapes would otherwise abort the
process inside gloo/NCCL with no hint of which tensor was wrong.

`checksum` is a position-weighted sum of a tensor's raw bytes (as 32/16/8-bit words) in int64
wrapping arithmetic. Wrapping addition is associative, so the value is the same on CPU and CUDA
and for any reduction order; the position weights make swapped or shifted data change it.
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
        return n * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


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


_PRIME = 65521  # position weights cycle through 1.._PRIME
_CHUNK = 1 << 22  # words per step, bounds the temporary memory of a checksum
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _position_weights(device: torch.device, offset: int, n: int) -> torch.Tensor:
    """(offset + i) % _PRIME + 1 for i < n (n <= _CHUNK), sliced from one cached table."""
    table = _WEIGHTS.get(device)
    if table is None:
        table = _WEIGHTS[device] = torch.arange(_CHUNK + _PRIME, device=device, dtype=torch.int64) % _PRIME + 1
    start = offset % _PRIME
    return table[start:start + n]


def checksum_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The checksum as an int64 scalar on the tensor's device (no host synchronisation)."""
    flat = tensor.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)
    for word in (torch.int32, torch.int16):
        if raw.numel() % torch.empty((), dtype=word).element_size() == 0:
            words = raw.view(word)
            break
    else:
        words = raw
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), _CHUNK):
        chunk = words[start : start + _CHUNK]
        total += (chunk.to(torch.int64) * _position_weights(words.device, start, chunk.numel())).sum()
    return total


def checksum(tensor: torch.Tensor) -> int:
    """Position-weighted int64 sum of the tensor's bytes; equal bytes give equal values everywhere."""
    return int(checksum_tensor(tensor).item())


def read_sums(sums: list[torch.Tensor]) -> list[int]:
    """Device scalars from `checksum_tensor` as ints, read back to the host once for all."""
    if not sums:
        return []
    if len({v.device for v in sums}) == 1:
        return torch.stack(sums).tolist()
    return [int(v.item()) for v in sums]
