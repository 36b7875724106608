#!/usr/bin/env python3
"""Issue 36 item 4 on one run: merged LoRA's log-prob gap against full fine-tuning's with the same
weights and the same samples, where the run-by-run comparison (`gap_compare.py`, `gap_pool.py`)
compares two trajectories that part after the first step.

SmolLM2-135M-Instruct with a rank-32 LoRA on every linear layer (alpha 64) takes two updates in
merge mode; a full fine-tuning trainer is loaded with exactly the weights merge mode syncs; both
score one batch of 16 random sequences (prompts of 20-60 tokens, responses of 1-160) in bfloat16.
The rollout receives the same bytes in both modes, so against any rollout of these weights the
two modes' gaps are equal exactly when the two trainers' log-probs are: the JSON gives their
largest and mean difference, and how far the adapter moved the log-probs from the base model's.

    PYTHONPATH=. python benchmarks/real_model/same_weights.py --device cpu \
        --out benchmarks/real_model/same_weights_cpu.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.provenance import with_provenance
from tests.gpu.test_lora_merge_gpu import same_weights_gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        (merge, full_ft, base), mask = same_weights_gap(args.device, Path(tmp))
    diff = (merge - full_ft).abs()[mask]
    record = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "model": "smollm2-135m-instruct, LoRA rank 32 alpha 64 on every linear layer, two updates at lr 1e-3",
        "response_tokens": int(mask.sum()),
        "merge_vs_full_ft_bitwise_equal": bool(torch.equal(merge[mask], full_ft[mask])),
        "merge_vs_full_ft_max_abs_diff": diff.max().item(),
        "merge_vs_full_ft_mean_abs_diff": diff.mean().item(),
        "adapter_moved_logprobs_max": (merge - base).abs()[mask].max().item(),
        "adapter_moved_logprobs_mean": (merge - base).abs()[mask].mean().item(),
        "seconds": round(time.perf_counter() - start, 1),
    }
    Path(args.out).write_text(json.dumps(with_provenance(record), indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
