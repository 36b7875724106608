#!/usr/bin/env python3
"""Weight-sync bandwidth: rlpost's protocol (`send_weights`/`receive_weights`: header, manifest
check, flat buckets, load into the receiver's tensors, checksums) vs a raw broadcast of the same
bytes as one buffer over the same process group, side by side in one pair of processes.

- `broadcast`: sender on GPU 0, receiver on GPU 1 (NCCL), as in split placement; goal >= 0.7x raw.
The receiver loads what it gets into its own tensors as an engine would (`torch._foreach_copy_`,
64 tensors per kernel); the raw broadcast lands in one buffer and loads nothing.
- `ipc`: sender and receiver share GPU 0 (CUDA IPC), as in colocate placement: time per sync.
On a machine without GPUs both processes use gloo on the CPU (checks the script, no claim).
The tensors have the names and shapes of `--model`'s checkpoint (random values, `--dtype`). JSON out;
`--bucket-mb 64,256` compares bucket sizes in one run; `--profile DIR` also writes each rank's
torch.profiler tables and traces of one sync with the first size, unverified and verified.

    python3 benchmarks/bench_weight_sync.py --model /tmp/qwen2-0.5b --out benchmarks/weight_sync_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provenance import with_provenance  # noqa: E402

from rlpost.rollout.vllm_weights import expected_manifest  # noqa: E402
from rlpost.weightsync.buckets import plan_buckets  # noqa: E402
from rlpost.weightsync.sync import receive_weights, send_weights  # noqa: E402
from rlpost.weightsync.transport import SyncGroup, free_port  # noqa: E402


def sync_mb(sync_s: float, nbytes: int) -> float:
    return nbytes / sync_s / 1e9


class Rank:
    """One process of the pair: its tensors (rank 0's random, rank 1's to be filled), the process
    group, and the syncs, raw broadcasts and control round trips it times."""

    def __init__(self, rank: int, args, port: int, transport: str, gpus: list[int]):
        self.rank, self.args, self.transport = rank, args, transport
        self.cuda = cuda = torch.cuda.is_available()
        self.device = device = f"cuda:{gpus[rank]}" if cuda else "cpu"
        if cuda:
            torch.cuda.set_device(gpus[rank])
        self.manifest = manifest = expected_manifest(args.model, args.dtype)
        self.dtype = dtype = getattr(torch, args.dtype)
        self.group = SyncGroup("127.0.0.1", port, rank, 2, device, 600, transport if cuda else "broadcast")
        g = torch.Generator(device=device).manual_seed(0)
        self.tensors = (
            [torch.randn(s.shape, generator=g, device=device).to(dtype) for s in manifest]
            if rank == 0
            else [torch.empty(s.shape, dtype=dtype, device=device) for s in manifest]
        )
        self.params = {s.name: t for s, t in zip(manifest, self.tensors)}
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors)
        self.phases: dict[str, list[float]] = {}  # this rank's header and verify time of each timed sync

    def load(self, named) -> None:  # like an engine that copies weights in batches (one kernel per 64 tensors)
        params = self.params
        batch: list[tuple[str, torch.Tensor]] = []
        for item in named:
            batch.append(item)
            if len(batch) == 64:
                torch._foreach_copy_([params[n] for n, _ in batch], [t for _, t in batch])
                batch.clear()
        if batch:
            torch._foreach_copy_([params[n] for n, _ in batch], [t for _, t in batch])

    def sync(self, verify: bool, version: int, bucket_mb: int, record: str = "") -> float:
        rank, cuda, group, manifest, phases = self.rank, self.cuda, self.group, self.manifest, self.phases
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        if rank == 0:
            stats = send_weights(group, manifest, iter(self.tensors), version, bucket_mb * 2**20, verify)
        else:
            stats = receive_weights(group, manifest, version, self.load, self.params.get)
        if cuda:
            torch.cuda.synchronize()
        group.barrier()
        if record:
            phases.setdefault(f"{record}_header", []).append(stats.header_s)
            phases.setdefault(f"{record}_verify", []).append(stats.verify_s)
        return time.perf_counter() - start

    def raw(self, bucket_mb: int = 0) -> float:
        """One broadcast of all the bytes, or (`bucket_mb`) one per bucket of rlpost's plan with
        nothing else: what bucketing alone costs."""
        cuda, group, manifest, dtype = self.cuda, self.group, self.manifest, self.dtype
        sizes = (
            [self.nbytes // dtype.itemsize]
            if not bucket_mb
            else [
                sum(torch.Size(manifest[i].shape).numel() for i in b) for b in plan_buckets(manifest, bucket_mb << 20)
            ]
        )
        flats = [torch.empty(n, dtype=dtype, device=self.device) for n in sizes]
        if cuda:
            torch.cuda.synchronize()
        group.barrier()
        start = time.perf_counter()
        for flat in flats:
            group.broadcast(flat, src=0)
        if cuda:
            torch.cuda.synchronize()
        group.barrier()
        return time.perf_counter() - start

    def control(self) -> float:
        """The round trip every sync starts with: a header broadcast and an all-reduce."""
        group, rank = self.group, self.rank
        group.barrier()
        start = time.perf_counter()
        group.broadcast_object({"version": 0, "plan": bytes(12000)} if rank == 0 else None)
        group.all_reduce_max(0)
        return time.perf_counter() - start

    def timed_rounds(self, sizes: list[int]) -> tuple[dict[str, list[float]], int]:
        """`--reps` rounds after a warm-up round, the variants taking turns: (each variant's times,
        the next sync's version)."""
        runs: dict[str, list[float]] = {"raw": [], "control": []}
        for mb in sizes:
            runs[f"raw_{mb}mb_buckets"], runs[f"rlpost_{mb}mb"], runs[f"rlpost_verified_{mb}mb"] = [], [], []
        version = 0
        for i in range(self.args.reps + 1):  # the first round warms up; the variants take turns
            broadcast = self.transport == "broadcast"
            times = {"raw": self.raw() if broadcast else float("nan"), "control": self.control()}
            for mb in sizes:
                times[f"raw_{mb}mb_buckets"] = self.raw(mb) if broadcast else float("nan")
                for verify in (False, True):
                    name = f"rlpost_{'verified_' if verify else ''}{mb}mb"
                    times[name] = self.sync(verify, version, mb, name if i else "")
                    version += 1
            if i:
                for k, v in times.items():
                    runs[k].append(v)
        return runs, version

    def write_profiles(self, bucket_mb: int, version: int) -> None:
        """torch.profiler's tables and traces of one unverified and one verified sync."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        by = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        folder = self.args.profile
        Path(folder).mkdir(parents=True, exist_ok=True)
        for verify in (False, True):
            with profile(activities=activities) as prof:
                self.sync(verify, version, bucket_mb)
            version += 1
            name = f"{self.transport}_{'verified' if verify else 'unverified'}_rank{self.rank}"
            prof.export_chrome_trace(str(Path(folder, f"{name}.trace.json")))
            Path(folder, f"{name}.txt").write_text(
                prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
                + "\n"
                + prof.key_averages().table(sort_by=by, row_limit=15)
                + "\n"
            )

    def check(self) -> None:
        """Every tensor arrived intact (the verified sync checked checksums too)."""
        g = torch.Generator(device=self.device).manual_seed(0)
        for s in self.manifest:
            expect = torch.randn(s.shape, generator=g, device=self.device).to(self.dtype)
            assert torch.equal(self.params[s.name], expect), s.name

    def report(self, runs: dict[str, list[float]]) -> dict:
        phases = {k: statistics.median(v) for k, v in self.phases.items()}
        if self.rank != 0:
            return {"receiver_phases_median": phases}
        med = {k: statistics.median(v) for k, v in runs.items()}
        return {
            "transport": self.transport,
            "bytes": self.nbytes,
            "tensors": len(self.manifest),
            "seconds_median": med,
            "seconds_runs": runs,
            "gb_per_s": {k: sync_mb(v, self.nbytes) for k, v in med.items() if v == v and k != "control"},
            "sender_phases_median": phases,
        }


def worker(rank: int, args, port: int, transport: str, gpus: list[int], queue) -> None:
    me = Rank(rank, args, port, transport, gpus)
    sizes = [int(mb) for mb in args.bucket_mb.split(",")]
    runs, version = me.timed_rounds(sizes)
    if args.profile:
        me.write_profiles(sizes[0], version)
    if rank == 1:
        me.check()
    queue.put(me.report(runs))


def run(args, transport: str, gpus: list[int]) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(worker, args=(args, free_port(), transport, gpus, queue), nprocs=2, start_method="spawn")
    first, second = queue.get(timeout=10), queue.get(timeout=10)
    return {**first, **second}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--bucket-mb", default="64", help="bucket sizes to compare, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", default="", help="folder for the profiler tables of one verified sync")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    n = torch.cuda.device_count()
    result = {
        "command": "python3 " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if n else "cpu (gloo; no claim)",
        "gpus": n,
    }
    if n >= 2 or n == 0:
        r = run(args, "broadcast", [0, 1])
        raw = r["seconds_median"]["raw"]
        r["over_raw"] = {k: raw / v for k, v in r["seconds_median"].items() if k.startswith("rlpost")}
        result["broadcast"] = r
    if n >= 1:
        result["ipc"] = run(args, "ipc", [0, 0])
    result = with_provenance(result)
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
