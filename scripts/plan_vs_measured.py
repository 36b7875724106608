#!/usr/bin/env python3
"""The memory plan (`rlpost plan`) of a run against what the run measured: the trainer's peak per
GPU in the update (`perf/update_peak_gb`, the allocator's peak, max over ranks) and the GPU memory
in use once the vLLM engines started (`rollout/gpu_used_gb`); and the plan again at the largest
micro-batch the run computed (`perf/microbatch_tokens`), since the plan itself sizes micro-batches
by full-length rows. Give the run folder and the same
overrides the run had; run on the machine that ran it (the GPU's size comes from torch), or
elsewhere with GPU_GIB=<its size> on a copy of the run folder.

    python3 scripts/plan_vs_measured.py /tmp/runs/a model.path=... trainer.world_size=2 > a.plan.json
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlpost.config import load_config  # noqa: E402
from rlpost.controller.plan import GIB, gpu_plan, micro_batch_tokens, shape_of  # noqa: E402
from rlpost.metrics.summary import read_metrics  # noqa: E402
from rlpost.models.loading import resolve_path  # noqa: E402


def main() -> None:
    run_dir, overrides = Path(sys.argv[1]), sys.argv[2:]
    cfg = load_config(overrides, this_machine=False)
    if "GPU_GIB" in os.environ:
        gpu_bytes = float(os.environ["GPU_GIB"]) * GIB
    else:
        import torch

        gpu_bytes = torch.cuda.mem_get_info()[1]
    shape = shape_of(cfg, resolve_path(cfg.model.path, cfg.model.cache_dir))  # a GGUF model: its folder
    plan = gpu_plan(cfg, shape, gpu_bytes)
    rows = read_metrics(run_dir)
    steps = [r for r in rows if "perf/update_peak_gb" in r]
    measured = max(r["perf/update_peak_gb"] for r in steps) if steps else None
    start = next((r for r in rows if r["step"] == 0), {})
    predicted = plan["trainer"]["peak"] / GIB
    # the plan again at the largest micro-batch the run computed (`perf/microbatch_tokens`): the
    # plan's own sizing is the worst case of full-length rows
    tokens = max((r.get("perf/microbatch_tokens", 0) for r in steps), default=0)
    at_measured = None
    if tokens:
        sized = copy.deepcopy(cfg)
        sized.trainer.max_tokens_per_microbatch = int(tokens)
        at_measured = gpu_plan(sized, shape, gpu_bytes)["trainer"]["peak"] / GIB
    out = {
        "run_dir": str(run_dir),
        "overrides": overrides,
        "gpu_gib": gpu_bytes / GIB,
        "micro_batch_tokens": micro_batch_tokens(cfg),
        "plan_gib": {k: v / GIB for k, v in plan["trainer"].items()},
        "plan_rollout_awake_gib": plan["rollout_awake"] / GIB,
        "plan_gpus_gib": {k: v / GIB for k, v in plan["gpus"].items()},
        "measured_update_peak_gib_per_step": [r["perf/update_peak_gb"] for r in steps],
        "measured_update_peak_gib": measured,
        "plan_over_measured": predicted / measured if measured else None,
        "measured_microbatch_tokens": tokens,
        "plan_at_measured_tokens_gib": at_measured,
        "plan_at_measured_tokens_over_measured": at_measured / measured if measured and at_measured else None,
        "measured_gpu_used_gib_at_start": start.get("rollout/gpu_used_gb"),
    }
    sys.path.insert(0, str(REPO / "benchmarks"))
    from provenance import with_provenance

    print(json.dumps(with_provenance(out), indent=1))


if __name__ == "__main__":
    main()
