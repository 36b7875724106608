"""What a weight sync carries, described before it is sent: the manifest, and the error a sync
raises when it fails its checks.

A `Manifest` lists every tensor (name, shape, dtype) in send order. Sender and receiver compare
manifests before any tensor moves (`verdict.compare_manifests`): a collective over mismatched
shapes would otherwise abort the process inside gloo/NCCL with no hint of which tensor was wrong.

From the manifest, a sync's tensors go through `buckets` (which tensors travel together),
`packing` (a bucket as one flat buffer), `checksums` (what was sent, received and loaded) and
`plan` (all of it worked out once per manifest) to `sync`, the protocol itself.
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
