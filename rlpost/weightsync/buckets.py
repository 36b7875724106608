"""The bucket plan of a weight sync: which consecutive tensors of a manifest travel together as
one flat buffer (`packing`), and how large each bucket is."""

from __future__ import annotations

from rlpost.weightsync.manifest import Manifest


def plan_buckets(manifest: Manifest, bucket_bytes: int) -> list[list[int]]:
    """Group consecutive tensors of one dtype into buckets of at most `bucket_bytes` (a larger
    tensor travels alone). The first and the last bucket take at most an eighth of that: nothing
    moves before the sender has packed the first one, and receivers checksum and load the last
    one after all else arrived, so the pipeline fills and drains in short steps."""
    edge, n = bucket_bytes // 8, len(manifest)
    tail, size = n, 0  # the last bucket: tensors at the end that fit in `edge`, at least one
    while tail and manifest[tail - 1].dtype == manifest[-1].dtype and size + manifest[tail - 1].nbytes <= edge:
        tail -= 1
        size += manifest[tail].nbytes
    tail = min(tail, n - 1) if n else 0
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i in range(tail):
        spec = manifest[i]
        cap = edge if len(buckets) == 1 else bucket_bytes
        if buckets and spec.dtype == dtype and size + spec.nbytes <= cap:
            buckets[-1].append(i)
            size += spec.nbytes
        else:
            buckets.append([i])
            size, dtype = spec.nbytes, spec.dtype
    if tail < n:
        buckets.append(list(range(tail, n)))
    return buckets
