#!/usr/bin/env python3
"""Host <-> GPU copies, for issue 42's 7B on one GPU (`gpu.sh one_7b`): what one profiled update
moved and how long the copies took, against what pinned copies reach on the same GPU.

    python3 benchmarks/real_model/memcpy.py --bandwidth          # pinned 1 GiB copies, GPU 0: GB/s each way
    python3 benchmarks/real_model/memcpy.py TRACE.json.gz        # a torch.profiler trace (trainer.profile_step)

Each prints one JSON object. A trace's copies are summed by kind (the `gpu_memcpy` events' names,
e.g. "Memcpy HtoD (Pinned -> Device)"): count, bytes, device seconds and GB/s while copying.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict


def trace_copies(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    kinds: dict[str, dict] = defaultdict(lambda: {"count": 0, "bytes": 0, "seconds": 0.0})
    for e in events:
        if e.get("cat") == "gpu_memcpy":
            k = kinds[e["name"]]
            k["count"] += 1
            k["bytes"] += int(e.get("args", {}).get("bytes", 0))
            k["seconds"] += e.get("dur", 0) / 1e6
    for k in kinds.values():
        k["gb_per_s"] = k["bytes"] / 1e9 / k["seconds"] if k["seconds"] else None
    return {"trace": path, "copies": dict(kinds)}


def bandwidth(gib: int = 1, repeats: int = 5) -> dict:
    import torch

    host = torch.empty(gib << 30, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device="cuda")
    out = {"gpu": torch.cuda.get_device_name(0), "bytes": host.numel(), "repeats": repeats}
    for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
        dst.copy_(src, non_blocking=True)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        out[f"{name}_gb_per_s"] = host.numel() * repeats / 1e9 / (start.elapsed_time(end) / 1e3)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", help="a torch.profiler trace (.json.gz)")
    ap.add_argument("--bandwidth", action="store_true", help="measure pinned copies on GPU 0 instead")
    a = ap.parse_args()
    if not (a.bandwidth or a.trace):
        ap.error("give a trace or --bandwidth")
    print(json.dumps(bandwidth() if a.bandwidth else trace_copies(a.trace)))
