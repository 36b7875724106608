#!/usr/bin/env python3
"""AdamW step: `layerwise` (states pinned on the host, streamed per unit) vs `cpu` (torch AdamW,
foreach, on the host with every core) vs `none` (fused AdamW, states on the GPU), side by side.

A Qwen2-shaped stack of decoder layers (default 26 layers of hidden 2048, MLP 11008, 2 KV heads:
2.0B parameters), float32 parameters, gradients and states, random values. Also measures the
pinned host<->device bandwidth with both directions at once and the transfer floor of the
layerwise step (its state bytes each way over that bandwidth). JSON out.

    python3 benchmarks/bench_optimizer.py --out benchmarks/optimizer_h100.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provenance import with_provenance  # noqa: E402

from rlpost.trainer.optim import LayerwiseAdamW  # noqa: E402


def layer_shapes(hidden: int, inter: int, kv: int) -> list[tuple[int, ...]]:
    return [
        (hidden, hidden),
        (hidden,),
        (kv, hidden),
        (kv,),
        (kv, hidden),
        (kv,),
        (hidden, hidden),
        (inter, hidden),
        (inter, hidden),
        (hidden, inter),
        (hidden,),
        (hidden,),
    ]


def make_units(args, device) -> list[list[torch.nn.Parameter]]:
    g = torch.Generator(device=device).manual_seed(0)
    units = []
    for _ in range(args.layers):
        unit = []
        for shape in layer_shapes(args.hidden, args.intermediate, args.kv_dim):
            p = torch.nn.Parameter(torch.randn(shape, device=device, generator=g) * 0.02)
            p.grad = torch.randn(shape, device=device, generator=g) * 1e-3
            unit.append(p)
        units.append(unit)
    return units


def timed(fn, steps: int, cuda: bool) -> list[float]:
    out = []
    for _ in range(steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return out


def bandwidth(nbytes: int) -> dict:
    """Pinned host->device and device->host GB/s, alone and both directions at once."""
    n = nbytes // 4
    host_in = torch.empty(n, dtype=torch.float32, pin_memory=True).normal_()
    host_out = torch.empty(n, dtype=torch.float32, pin_memory=True)
    dev_in = torch.empty(n, dtype=torch.float32, device="cuda")
    dev_out = torch.randn(n, dtype=torch.float32, device="cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def h2d():
        with torch.cuda.stream(s1):
            dev_in.copy_(host_in, non_blocking=True)

    def d2h():
        with torch.cuda.stream(s2):
            host_out.copy_(dev_out, non_blocking=True)

    def both():
        h2d()
        d2h()

    res = {}
    for name, fn in (("h2d", h2d), ("d2h", d2h), ("both", both)):
        times = timed(fn, 5, True)[1:]
        t = sorted(times)[len(times) // 2]
        res[f"{name}_gb_s"] = nbytes / t / 1e9  # per direction (both: each way, concurrently)
    return res


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=26)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--kv-dim", type=int, default=256)
    p.add_argument("--prefetch", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--cpu-steps", type=int, default=3)
    p.add_argument("--out", default="")
    return p.parse_args()


def measure_layerwise(units, args, hyper: dict) -> dict:
    """layerwise: states pinned on the host, streamed through the GPU. Its extra GPU memory is the
    device slots it keeps for the whole run plus the step's temporaries: both are counted,
    from the memory in use before the optimizer was built."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    opt = LayerwiseAdamW(units, prefetch_layers=args.prefetch, **hyper)
    slots = torch.cuda.memory_allocated() - base
    opt.step()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = timed(opt.step, args.steps, True)
    result = {
        "step_s_median": sorted(times)[len(times) // 2],
        "step_s_all": times,
        "extra_peak_gb": (torch.cuda.max_memory_allocated() - base) / 2**30,
        "slots_gb": slots / 2**30,
        "prefetch_layers": args.prefetch,
    }
    del opt
    torch.cuda.empty_cache()
    return result


def measure_fused(params, steps: int, hyper: dict, numel: int) -> dict:
    """none: fused AdamW with states on the GPU."""
    opt = torch.optim.AdamW(params, fused=True, **hyper)
    opt.step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    times = timed(opt.step, steps, True)
    result = {
        "step_s_median": sorted(times)[len(times) // 2],
        "step_s_all": times,
        "extra_peak_gb": (torch.cuda.max_memory_allocated() - before) / 2**30,
        "resident_state_gb": numel * 8 / 2**30,
    }
    del opt
    torch.cuda.empty_cache()
    return result


def measure_cpu(cpu_params, steps: int, hyper: dict) -> dict:
    """cpu: everything on the host, torch AdamW foreach with all cores."""
    opt = torch.optim.AdamW(cpu_params, foreach=True, **hyper)
    opt.step()
    times = timed(opt.step, steps, False)
    return {
        "step_s_median": sorted(times)[len(times) // 2],
        "step_s_all": times,
        "threads": torch.get_num_threads(),
    }


def goals(report: dict, prefetch: int) -> dict:
    lw = report["layerwise"]
    return {
        "layerwise_over_floor": lw["step_s_median"] / report["transfer_floor_s"],
        "layerwise_over_floor_goal": 1.15,
        "cpu_over_layerwise": report["cpu"]["step_s_median"] / lw["step_s_median"],
        "cpu_over_layerwise_goal": 4.0,
        "extra_peak_gb": lw["extra_peak_gb"],
        "extra_peak_budget_gb": (prefetch + 1) * report["unit_state_gb"] * 1.1,
    }


def main() -> int:
    args = parse_args()
    hyper = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    report: dict = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "host_cores": os.cpu_count(),
    }

    units = make_units(args, "cuda")
    numel = sum(p.numel() for u in units for p in u)
    unit_state_bytes = max(sum(p.numel() for p in u) for u in units) * 8
    report.update(params=numel, layers=args.layers, state_bytes=numel * 8, unit_state_gb=unit_state_bytes / 2**30)
    report["layerwise"] = measure_layerwise(units, args, hyper)
    params = [p for u in units for p in u]
    report["none"] = measure_fused(params, args.steps, hyper, numel)

    # bandwidth and the transfer floor of the layerwise step
    bw = bandwidth(1 << 30)
    report["bandwidth"] = bw
    report["transfer_floor_s"] = numel * 8 / (bw["both_gb_s"] * 1e9)

    # cpu: the states copied to the host, the GPU's copies freed
    torch.set_num_threads(os.cpu_count())
    cpu_params = [torch.nn.Parameter(p.detach().cpu()) for p in params]
    for cp, p in zip(cpu_params, params):
        cp.grad = p.grad.cpu()
    del units, params
    torch.cuda.empty_cache()
    report["cpu"] = measure_cpu(cpu_params, args.cpu_steps, hyper)

    report["goals"] = goals(report, args.prefetch)
    text = json.dumps(with_provenance(report), indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
