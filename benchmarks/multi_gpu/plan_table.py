#!/usr/bin/env python3
"""What 7B, 32B and 72B (Qwen2.5 shapes) need on 8, 16 and 64 GPUs, by `rlpost plan`'s memory
model (no GPU needed): for each, the first of these settings whose plan fits an 80 GiB GPU,
colocated (FSDP2 over every GPU, vLLM replicas of the smallest tensor-parallel size whose bf16
weights take at most half of the engine's share; eager, as colocated TP must be), with the run
of issue 42 (128 prompts x 8 samples x 1024 tokens, a KL reference), each at the largest
micro-batch (8k tokens down to 512) that fits: plain; Adam's states streamed from the host
(`trainer.optim.offload=layerwise`); that and the parameters offloaded between phases
(`trainer.param_offload=true`); FSDP's CPU offload (`trainer.optim.offload=cpu`: weights,
gradients and Adam on the host, the optimizer step on the CPU).

What is measured and what is assumed: the plan was within 1.02-1.04x of the measured update peak
on every GPU run made (0.5B-3B random shapes, SmolLM2 on 1-4 GPUs: multi_gpu/*.json); that it holds
at 7B-72B and at world 64 is assumed. Times are not predicted here.

    python benchmarks/multi_gpu/plan_table.py --out benchmarks/multi_gpu/plan_table.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from provenance import provenance  # noqa: E402
from random_model import build  # noqa: E402

from rlpost.config import ConfigError, load_config  # noqa: E402
from rlpost.controller.plan import CONTEXT_GIB, GIB, check_plan, gpu_plan, shape_of  # noqa: E402

MICRO_BATCH_TOKENS = (8192, 4096, 2048, 1024, 512)  # tried largest first: rlpost keeps every layer's activations
RUN = [
    "model.dtype=bfloat16", "model.attn_implementation=rlpost_varlen", "trainer.device=cuda", "rollout.backend=vllm",
    "data.task=arithmetic", "data.max_prompt_length=128", "data.train_batch_size=128", "rollout.n=8",
    "rollout.max_response_length=1024", "trainer.micro_batch_size=64",
    "algo.kl_coef=0.001",
]  # fmt: skip
SETTINGS = {
    "plain": [],
    "layerwise Adam": ["trainer.optim.offload=layerwise"],
    "layerwise Adam + param offload": ["trainer.optim.offload=layerwise", "trainer.param_offload=true"],
    "FSDP CPU offload": ["trainer.optim.offload=cpu"],
}


def engine_tp(params: float, heads: int, gpu_gib: float, utilization: float) -> int:
    """The smallest tensor-parallel size (dividing the heads) whose bf16 weights per shard take at
    most half of vLLM's share of the GPU (the rest: KV cache)."""
    for tp in (1, 2, 4, 8):
        if heads % tp == 0 and 2 * params / tp <= 0.5 * utilization * gpu_gib * GIB:
            return tp
    return 0


def plan_of(overrides: list[str], shape, gpu_gib: float) -> dict:
    cfg = load_config(overrides, this_machine=False)
    plan = gpu_plan(cfg, shape, gpu_gib * GIB)
    try:
        check_plan(cfg, plan, log=lambda *_: None)
        fixed_fits = True
    except ConfigError:
        fixed_fits = False
    room = gpu_gib - 2 * CONTEXT_GIB  # colocated: a trainer and an engine process
    peak = max(plan["gpus"].values()) / GIB
    return {"fits": fixed_fits and peak <= room, "gpu_peak_gib": round(peak, 1), "plan": plan}


def row(path: str, gpus: int, gpu_gib: float) -> dict:
    """Per setting, the largest micro-batch (tokens) whose plan fits, and its parts."""
    base = [f"model.path={path}", *RUN, f"trainer.world_size={gpus}"]
    shape = shape_of(load_config(base, this_machine=False), path)
    tp = engine_tp(shape.params, shape.heads, gpu_gib, 0.5)
    engines = [f"rollout.tensor_parallel_size={max(tp, 1)}", f"rollout.num_workers={gpus // max(tp, 1)}"]
    base += engines + (["rollout.enforce_eager=true"] if tp > 1 else [])
    out = {"params_b": round(shape.params / 1e9, 2), "gpus": gpus, "rollout_tp": tp, "replicas": gpus // max(tp, 1)}
    for name, extra in SETTINGS.items():
        found = {"fits": False}
        for tokens in MICRO_BATCH_TOKENS:
            p = plan_of(base + extra + [f"trainer.max_tokens_per_microbatch={tokens}"], shape, gpu_gib)
            t = p.pop("plan")["trainer"]
            parts = {k: round(t[k] / GIB, 1) for k in ("weights", "reference", "adam", "gradients", "activations")}
            found = p | {"micro_batch_tokens": tokens, "between_phases_gib": round(t["resident"] / GIB, 1), **parts}
            if p["fits"]:
                break
        out[name] = found
    out["first_that_fits"] = next((n for n in SETTINGS if out[n]["fits"] and tp > 0), None)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu-gib", type=float, default=80.0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in ("7b", "32b", "72b"):
            path = build(shape, f"{tmp}/{shape}", config_only=True)
            rows += [{"shape": shape} | row(path, gpus, a.gpu_gib) for gpus in (8, 16, 64)]
    out = {**provenance(), "gpu_gib": a.gpu_gib, "run": RUN, "note": __doc__.split("\n\n")[0], "rows": rows}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        best = r[r["first_that_fits"]] if r["first_that_fits"] else {}
        print(r["shape"], r["gpus"], "tp", r["rollout_tp"], r["first_that_fits"], best)


if __name__ == "__main__":
    main()
