#!/usr/bin/env python3
"""rlpost against TRL's `GRPOTrainer` on identical work, median seconds per step.

The work: the quickstart's tiny Qwen2 model (0.8M parameters, float32), 16 prompts x 8 samples
of 2-digit addition per step, at most 4 response tokens, exact-match reward, GRPO (group-std
advantages, token-mean PPO-clip loss, no KL), AdamW lr `--lr` (1e-4) with 10 warm-up steps then constant,
gradient clip 1.0, `--steps` steps, one thread per process. rlpost runs it with one trainer rank
and one hf rollout actor, colocated (they take turns) and split (one-step-off-policy: the next
batch is generated while this one trains). TRL runs it in one process (generation with
`transformers.generate`, no vLLM). Both end with the held-out greedy accuracy on the same 256
problems, to show that both learned. The three runs follow one another, `--rounds` times, round r
with seed r for all three (data order and sampling; the start model is the same); each ratio is
the median of the rounds' ratios (this VM's speed drifts by 10% and more between minutes: one
round alone gave colocate 0.83x, two others 0.95x and 0.94x).

TRL is a benchmark here, not a dependency: install it in a venv of its own that sees this one's
packages, and pass its python:

    python -m venv /tmp/trlenv --system-site-packages && /tmp/trlenv/bin/pip install trl==1.16.0
    python benchmarks/bench_trl.py --trl-python /tmp/trlenv/bin/python --out benchmarks/trl_vs_rlpost.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import with_provenance

REPO = Path(__file__).resolve().parents[1]
PROMPTS, N, WARMUP = 16, 8, 10
RLPOST = [
    "+recipe=quickstart",
    f"data.train_batch_size={PROMPTS}",
    f"rollout.n={N}",
    "trainer.world_size=1",
    "trainer.micro_batch_size=128",
    "algo.kl_coef=0",
    f"trainer.optim.warmup_steps={WARMUP}",
    "trainer.optim.lr_schedule=constant",
    "cluster.num_threads=1",
    "logger.progress_bar=false",
]
PLACEMENTS = {
    "colocate": ["cluster.placement=colocate"],
    "split": ["cluster.placement=split", "algo.max_staleness=1"],
}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


# ----------------------------------------------------------------------------------------- TRL
def trl_work(lr: float):
    """In the TRL venv: the work's config, model path, tokenizer, training set (a `datasets.Dataset`)
    and held-out rows, read as rlpost reads them."""
    from datasets import Dataset

    from rlpost.config import load_config
    from rlpost.controller.setup import data_sources
    from rlpost.data.dataset import read_rows
    from rlpost.models.loading import load_tokenizer
    from rlpost.tiny.build import resolve_model_path

    cfg = load_config([*RLPOST, f"trainer.optim.lr={lr}"])
    path = resolve_model_path(cfg.model, cfg.data)
    tok = load_tokenizer(path)
    train_src, val_src = data_sources(cfg)
    train_rows = [r for src in train_src for r in read_rows(src)]
    val_rows = [r for src in val_src for r in read_rows(src)]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": str(r["ground_truth"])} for r in train_rows])
    return cfg, path, tok, dataset, val_rows


def grpo_config(cfg, output_dir: str, steps: int, lr: float, seed: int):
    """TRL's settings for the same GRPO as rlpost's."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=PROMPTS * N,
        num_generations=N,
        max_completion_length=cfg.rollout.max_response_length,
        max_steps=steps,
        learning_rate=lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=WARMUP,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",  # token-mean over the batch, as rlpost's token-mean
        scale_rewards="group",
        temperature=cfg.rollout.temperature,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=50,
        seed=seed,
    )


def run_trl(steps: int, lr: float, seed: int, out: str) -> None:
    """In the TRL venv: GRPOTrainer on the same model, prompts and reward."""
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOTrainer

    sys.path.insert(0, str(REPO))
    from rlpost.rewards import RewardInput
    from rlpost.rewards.builtin import arithmetic
    from rlpost.tiny.build import evaluate_start

    torch.set_num_threads(1)
    cfg, path, tok, dataset, val_rows = trl_work(lr)

    def reward(prompts, completions, ground_truth, **_):
        return [arithmetic(RewardInput(p, c, g, "arithmetic")) for p, c, g in zip(prompts, completions, ground_truth)]

    times: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.start)

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        args = grpo_config(cfg, tmp, steps, lr, seed)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=dataset,
            processing_class=tok,
            callbacks=[StepTimes()],
        )
        trainer.train()
    model.eval()
    acc = evaluate_start(model, tok, val_rows, 1, cfg.rollout.max_response_length, 0)
    Path(out).write_text(json.dumps({"step_s": times, "val_accuracy": acc["greedy_accuracy"]}))


# -------------------------------------------------------------------------------------- rlpost
def run_rlpost(steps: int, lr: float, seed: int, placement: str, pin: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*pin, sys.executable, "-m", "rlpost.cli", "train", *RLPOST, f"trainer.optim.lr={lr}"]
        cmd += PLACEMENTS[placement]
        cmd += [f"trainer.total_steps={steps}", f"trainer.val_every={steps}", f"run.seed={seed}", f"run.dir={tmp}/run"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"rlpost {placement} failed:\n{proc.stderr[-3000:]}")
        rows = [json.loads(line) for line in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if r["step"] > 0]
    phases = ("gen", "reward", "logprob", "update", "weight_sync")
    return {
        "step_s": [r["timing_s/step"] for r in steps_rows],
        "phases_median_s": {
            p: round(statistics.median(r.get(f"timing_s/{p}", 0.0) for r in steps_rows), 4) for p in phases
        },
        "val_accuracy": [r["val/accuracy"] for r in rows if "val/accuracy" in r][-1],
        "start_accuracy": [r["val/accuracy"] for r in rows if "val/accuracy" in r][0],
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--trl-python", help="the python of a venv with trl installed")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--skip", type=int, default=10, help="first steps left out of the median")
    ap.add_argument("--rounds", type=int, default=3, help="TRL, colocate and split, this many times in turn")
    ap.add_argument(
        "--cpus",
        help="pin every run (TRL's process; rlpost's driver, Ray and its actors) to these cores (taskset -c)",
    )
    ap.add_argument("--trl-only", help=argparse.SUPPRESS)  # internal: run TRL, write to this file
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # internal: TRL's seed
    return ap.parse_args()


def one_round(args, seed: int, env: dict) -> dict:
    """TRL (in its venv), then rlpost colocated, then split, all with `seed`: each one's results."""
    results, pin = {}, (["taskset", "-c", args.cpus] if args.cpus else [])
    with tempfile.TemporaryDirectory() as tmp:
        trl_out = f"{tmp}/trl.json"
        cmd = [*pin, args.trl_python, __file__, "--trl-only", trl_out, "--steps", str(args.steps), "--lr", str(args.lr)]
        cmd += ["--seed", str(seed)]
        subprocess.run(cmd, cwd=REPO, env=env, check=True)
        results["trl"] = json.loads(Path(trl_out).read_text())
    for placement in PLACEMENTS:
        results[f"rlpost_{placement}"] = run_rlpost(args.steps, args.lr, seed, placement, pin)
    return results


def round_summary(results: dict, skip: int) -> dict:
    """One round: each runner's median step (and phases) and held-out accuracy, rlpost's step over TRL's."""
    summary = {}
    for name, r in results.items():
        summary[name] = {
            "median_step_s": round(statistics.median(r["step_s"][skip:]), 4),
            "val_accuracy": r["val_accuracy"],
            **({"phases_median_s": r["phases_median_s"]} if "phases_median_s" in r else {}),
        }
    trl = summary["trl"]["median_step_s"]
    for placement in PLACEMENTS:
        summary[f"rlpost_{placement}"]["vs_trl"] = round(summary[f"rlpost_{placement}"]["median_step_s"] / trl, 3)
    return summary


def over_rounds(rounds: list[dict], names) -> dict:
    summary = {  # each runner's median over rounds; each ratio the median of the rounds' ratios
        name: {
            key: round(statistics.median(r[name][key] for r in rounds), 4)
            for key in rounds[0][name]
            if key != "phases_median_s"
        }
        for name in names
    }
    for name in names:  # and every seed's held-out accuracy
        summary[name]["val_accuracy_by_seed"] = [r[name]["val_accuracy"] for r in rounds]
        if name != "trl":
            summary[name]["accuracy_vs_trl"] = permutation_test(
                summary[name]["val_accuracy_by_seed"], summary["trl"]["val_accuracy_by_seed"]
            )
    return summary


def permutation_test(a: list[float], b: list[float]) -> dict:
    """The difference of mean held-out accuracy (a - b) and its two-sided p-value under an exact
    permutation test: how often relabelling the pooled seeds gives a difference at least as large."""
    pooled, k = a + b, len(a)
    observed = statistics.mean(a) - statistics.mean(b)
    splits = list(itertools.combinations(range(len(pooled)), k))
    extreme = 0
    for chosen in splits:
        left = [pooled[i] for i in chosen]
        right = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        extreme += abs(statistics.mean(left) - statistics.mean(right)) >= abs(observed) - 1e-12
    return {"mean_difference": round(observed, 4), "p_value": round(extreme / len(splits), 4), "seeds": k}


def main() -> None:
    args = parse_args()
    if args.trl_only:
        run_trl(args.steps, args.lr, args.seed, args.trl_only)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    rounds, start_accuracy = [], None
    for seed in range(args.rounds):  # TRL, colocate, split in turn: a slow spell of the VM falls on one round
        results = one_round(args, seed, env)
        start_accuracy = results["rlpost_colocate"]["start_accuracy"]
        summary = round_summary(results, args.skip)
        rounds.append({"seed": seed, **summary})
        print(json.dumps({k: v.get("vs_trl", v["median_step_s"]) for k, v in summary.items()}), flush=True)
    summary = over_rounds(rounds, results)
    version = subprocess.run(
        [args.trl_python, "-c", "import trl; print(trl.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    out = {
        "command": f"python benchmarks/bench_trl.py --trl-python {args.trl_python} --out {args.out} "
        f"--steps {args.steps} --lr {args.lr} --rounds {args.rounds}" + (f" --cpus {args.cpus}" if args.cpus else ""),
        "pinned_to_cores": args.cpus or "none (each process on any core)",
        "lr": args.lr,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "trl_version": version,
        "steps": args.steps,
        "median_over": f"steps {args.skip + 1}..{args.steps}",
        "start_accuracy": start_accuracy,
        "summary": summary,
        "rounds": rounds,
    }
    out = with_provenance(out)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
