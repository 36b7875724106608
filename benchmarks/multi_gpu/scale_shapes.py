#!/usr/bin/env python3
"""Issue 37's scale figures from one unpacked `gpu.sh scale` stage (and `scale_sync`, when given):
per run of benchmarks/multi_gpu/jobs_scale.txt the step time by phase (median over the steps after
the first; a run that a deadline stopped counts from two such steps (`--min-steps`), `finished` false), tokens per
second per GPU, the rollout's generated tokens per second per rollout GPU (synchronous runs:
ahead of the trainer, the gen phase is a wait), the update's model FLOPs utilisation, the verified
sync's time and GB/s, and the update's memory peak beside `rlpost plan`'s (scale.py's `plan_of`);
with `--sync`, the raw NCCL broadcast of the same bytes on the same GPUs (bench_weight_sync.py).

MFU = 6 x N x tokens / update time / (trainer GPUs x the GPU's dense bf16 peak): N the parameters
that take part in matmuls (the input embedding left out where it is not tied to the head), tokens
every prompt and response token the update trains on; attention's own FLOPs are left out (at 544
tokens a sample, a few percent).

    python benchmarks/multi_gpu/scale_shapes.py /tmp/gpu/scale --sync /tmp/gpu/scale_sync \
        --peak-tflops 989.4 --gpu-gib 79.6 --command "..." --out benchmarks/multi_gpu/scale_shapes_h100x4.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "real_model"))
sys.path.insert(0, str(REPO / "benchmarks" / "multi_gpu"))
sys.path.insert(0, str(REPO))

from collect import machine, shell_env, started, train_command  # noqa: E402
from scale import gpu_peaks, plan_of  # noqa: E402

PHASES = ("gen", "reward", "logprob", "update", "weight_sync", "step")


def matmul_params(config: dict) -> int:
    """Parameters of a Qwen2/Llama config that take part in matmuls (norms left out: negligible)."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    layers = config["num_hidden_layers"]
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    attention = h * h * 2 + h * kv * 2 + (h + 2 * kv)  # q, o; k, v; the q/k/v biases (Qwen2)
    return layers * (attention + 3 * h * i) + v * h  # + the head (the input embedding is a lookup)


def layout(overrides: list[str]) -> dict:
    get = dict(o.split("=", 1) for o in overrides if "=" in o)
    world, replicas = int(get.get("trainer.world_size", 1)), int(get.get("rollout.num_workers", 1))
    tp, split = int(get.get("rollout.tensor_parallel_size", 1)), get.get("cluster.placement") == "split"
    return {
        "placement": "split" if split else "colocate",
        "trainer_gpus": world,
        "rollout_gpus": replicas * tp if split else 0,
        "gpus": world + (replicas * tp if split else 0),
        "tensor_parallel_size": tp,
        "max_staleness": int(get.get("algo.max_staleness", 0)),
        "model": get["model.path"],
        "samples_per_step": int(get.get("data.train_batch_size", 0)) * int(get.get("rollout.n", 1)) or None,
    }


def median_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else None


def run_figures(folder: Path, lay: dict, peak_flops: float) -> dict:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = {r["step"]: r for r in rows if r.get("step", 0) > 1 and "timing_s/step" in r}  # after the first
    rows = list(steps.values())
    model = json.loads(Path(lay["model"], "config.json").read_text())
    n = matmul_params(model)
    tokens = [r["perf/tokens_per_s"] * r["timing_s/step"] for r in rows]
    update = [r["timing_s/update"] for r in rows]
    sync = [(r["weight_sync/bytes"], r["timing_s/weight_sync"]) for r in rows if "weight_sync/bytes" in r]
    out = {"steps": sorted(steps), "matmul_params": n}
    out["phase_s"] = {p: median_of(rows, f"timing_s/{p}") for p in PHASES}
    out["tokens_per_step"] = statistics.median(tokens) if tokens else None
    out["tokens_per_s_per_gpu"] = median_of(rows, "perf/tokens_per_s") / lay["gpus"] if rows else None
    mfu = [6 * n * t / u / (lay["trainer_gpus"] * peak_flops) for t, u in zip(tokens, update)]
    out["update_mfu"] = statistics.median(mfu) if mfu else None
    if lay["samples_per_step"] and lay["max_staleness"] == 0:  # ahead of the trainer, gen is the wait for it
        rollout_gpus = lay["rollout_gpus"] or lay["gpus"]
        made = [r["response_length/mean"] * lay["samples_per_step"] / r["timing_s/gen"] for r in rows]
        out["gen_tokens_per_s_per_gpu"] = statistics.median(made) / rollout_gpus if made else None
    if sync:
        out["sync_bytes"] = sync[0][0]
        out["sync_gb_per_s"] = statistics.median(b / s / 1e9 for b, s in sync)
    out["verified"] = all(r.get("weight_sync/verified", 1.0) == 1.0 for r in rows)
    for key in ("update_peak_gb", "update_reserved_gb", "device_used_gb"):  # allocator peak, its reserve, the GPU
        out[key] = max((r[f"perf/{key}"] for r in rows if f"perf/{key}" in r), default=None)
    out["staleness_mean"] = median_of(rows, "rollout/staleness")
    out["reward_std"] = median_of(rows, "reward/std")  # rewards that vary: the run trains
    out["grad_norm"] = median_of(rows, "actor/grad_norm")
    return out


def raw_broadcasts(folder: Path | None) -> dict:
    """Per shape, the raw NCCL broadcast's and rlpost's verified sync's GB/s (bench_weight_sync.py)."""
    out = {}
    for f in sorted(folder.glob("weight_sync_*.json")) if folder else []:
        d = json.loads(f.read_text())["broadcast"]
        s, nbytes = d["seconds_median"], d["bytes"]
        verified = next(v for k, v in s.items() if k.startswith("rlpost_verified"))
        out[f.stem.removeprefix("weight_sync_")] = {
            "bytes": nbytes,
            "raw_gb_per_s": nbytes / s["raw"] / 1e9,
            "rlpost_verified_gb_per_s": nbytes / verified / 1e9,
            "ratio": s["raw"] / verified,
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", type=Path)
    p.add_argument("--sync", type=Path, help="an unpacked `gpu.sh scale_sync` stage")
    p.add_argument("--peak-tflops", type=float, required=True, help="the GPU's dense bf16 peak (H100/H200 SXM: 989.4)")
    p.add_argument("--gpu-gib", type=float, required=True, help="the GPU's memory, for the plan (H200: 140.4)")
    p.add_argument("--command", required=True)
    p.add_argument("--note", default="")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--min-steps", type=int, default=2, help="steps after the first that a stopped run needs to count")
    a = p.parse_args()
    runs = {}
    scale_jobs = {  # a profiled run's figures are the profiler's too: its tables stand apart (profile/)
        n: job
        for n, job in started(a.stage).items()
        if any(w.startswith("model.path=") for w in job[1]) and not any("profile_step" in w for w in job[1])
    }
    for name, (gpus, overrides) in scale_jobs.items():
        lay = layout(overrides)
        done = (a.stage / f"{name}.done").exists()
        env = shell_env(a.stage).get(name, "")
        runs[name] = lay | {"finished": done, "command": train_command(gpus, overrides, env), "env": env or None}
        figures = (
            run_figures(a.stage / name, lay, a.peak_tflops * 1e12)
            if (a.stage / name / "metrics.jsonl").exists()
            else {}
        )
        if len(figures.get("steps", [])) >= a.min_steps:  # a stopped run counts with --min-steps after the first
            runs[name] |= figures
            memory = plan_of(a.stage / name, train_command(gpus, overrides), a.gpu_gib, [])
            runs[name]["memory"] = memory | {"nvidia_smi_peak_gib": gpu_peaks(a.stage, name)}
    out = {**machine(a.stage), "command": a.command, "note": a.note, "peak_tflops": a.peak_tflops}
    out |= {"raw_broadcast": raw_broadcasts(a.sync), "runs": runs}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, r in runs.items():
        plan = r.get("memory", {}).get("plan_over_measured")
        figures = {k: r.get(k) for k in ("tokens_per_s_per_gpu", "update_mfu", "sync_gb_per_s")}
        print(name, figures, plan, r.get("phase_s"))


if __name__ == "__main__":
    main()
