#!/usr/bin/env python3
"""Micro-timings of the read-back checksums on one GPU, in ms (host time to queue, total with the
GPU done): 288 tensors of the 24 layers of a Qwen2.5-0.5B shape (716 MB bf16). Compares packing by
`torch.cat` with copies into cached views, `checksums` (a one-off `ReadBack` per call) with a kept
`ReadBack`, which checksums aligned tensors in place with one Triton kernel, and with a kept `ReadBack`
that stages every tensor (the kernel turned off), against `bucket_checksums` of one flat buffer of
the same bytes (one read at memory speed). Prints one line each.

    python3 benchmarks/bench_checksums.py      # the F stage of benchmarks/gpu_session.sh runs it
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlpost.weightsync import cuda_checksums  # noqa: E402
from rlpost.weightsync.checksums import ReadBack, _row_sums, bucket_checksums, checksums  # noqa: E402
from rlpost.weightsync.packing import layout, pack, unpack  # noqa: E402

dev = torch.device("cuda")
h, i, kv = 896, 4864, 128
ts = []
for _ in range(24):
    ts += [
        torch.randn(h, h, device=dev).bfloat16(),
        torch.randn(h, device=dev).bfloat16(),
        torch.randn(kv, h, device=dev).bfloat16(),
        torch.randn(kv, device=dev).bfloat16(),
        torch.randn(kv, h, device=dev).bfloat16(),
        torch.randn(kv, device=dev).bfloat16(),
        torch.randn(h, h, device=dev).bfloat16(),
        torch.randn(i, h, device=dev).bfloat16(),
        torch.randn(i, h, device=dev).bfloat16(),
        torch.randn(h, i, device=dev).bfloat16(),
        torch.randn(h, device=dev).bfloat16(),
        torch.randn(h, device=dev).bfloat16(),
    ]
nbytes = sum(t.numel() * 2 for t in ts)


def tm(f, n=20):
    f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    host = (time.perf_counter() - t) / n
    torch.cuda.synchronize()
    return host * 1e3, (time.perf_counter() - t) / n * 1e3


print("bytes", nbytes, "tensors", len(ts))
print("pack (cat) host/total ms", tm(lambda: pack(ts, dev)))
places = layout([t.shape for t in ts], 2)
buf = torch.zeros(sum(t.numel() for t in ts) * 2, dtype=torch.bfloat16, device=dev)
views = unpack(buf, places)
print("foreach_copy cached views", tm(lambda: torch._foreach_copy_(views, ts)))
print("unpack views + foreach_copy", tm(lambda: torch._foreach_copy_(unpack(buf, places), ts)))
flat = pack(ts, dev)
numels = [t.numel() for t in ts]
print("bucket_checksums (kernel)", tm(lambda: bucket_checksums(flat, numels)))
print("checksums (a one-off ReadBack per call)", tm(lambda: checksums(ts)))
big = [t for t in ts if t.numel() * 2 % 1024 == 0]
print(
    "in-place row sums of aligned",
    len(big),
    tm(lambda: torch.cat([_row_sums(t.view(-1).view(torch.uint8)) for t in big])),
)
x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev)
print("plain copy same bytes", tm(lambda: x.copy_(flat[: x.numel()])))
rb = ReadBack(ts)
assert rb.kernel is not None and len(rb.in_place) == len(ts)
assert rb(ts).tolist() == checksums([t.cpu() for t in ts])
print("ReadBack (in place)", tm(lambda: rb(ts).tolist()))
cuda_checksums.available = lambda device: False
print("bucket_checksums (torch ops)", tm(lambda: bucket_checksums(flat, numels)))
staged = ReadBack(ts)
assert staged.kernel is None and staged(ts).tolist() == rb(ts).tolist()
print("ReadBack (staged)", tm(lambda: staged(ts).tolist()))
