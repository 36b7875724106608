#!/usr/bin/env python3
"""The quickstart over several seeds, each a stand-in for another machine: a different tiny model
(`model.tiny.seed`, its initialisation and warm-up) and a different run (`run.seed`: data order and
sampling). Every run starts from an empty cache, as a new user's first run does, and is timed
from the command line to the end. Writes per seed the start model's held-out greedy accuracy and
pass@k, the validation accuracy before and after training, the wall time and where it went.

    python benchmarks/quickstart_seeds.py --seeds 0 1 2 3 4 --out benchmarks/quickstart_seeds.json
    python benchmarks/quickstart_seeds.py --seeds 7 --recipe grpo_lora --out /tmp/lora.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from provenance import with_provenance  # noqa: E402
from summarize_run import summarize  # noqa: E402


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def train(recipe: str, seed: int, run_dir: Path, cache: Path, extra: list[str]):
    """`rlpost train` of `recipe` with the tiny model and the run seeded by `seed`, from the command
    line: (command, finished process, wall seconds)."""
    cmd = [
        sys.executable,
        "-m",
        "rlpost.cli",
        "train",
        f"+recipe={recipe}",
        f"model.tiny.seed={seed}",
        f"run.seed={seed}",
        f"run.dir={run_dir}",
        f"model.cache_dir={cache}",
        "logger.progress_bar=false",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    return cmd, proc, time.time() - start


def run_seed(seed: int, recipe: str, extra: list[str], workdir: Path) -> dict:
    run_dir, cache = workdir / f"run{seed}", workdir / f"cache{seed}"  # empty cache: the model is built
    cmd, proc, wall = train(recipe, seed, run_dir, cache, extra)
    if proc.returncode != 0:
        return {"seed": seed, "error": proc.stderr[-3000:], "wall_s": wall}
    s = summarize(str(run_dir), skip=0)
    (_, start_acc), (end_step, end_acc) = s["val_accuracy"][0], s["val_accuracy"][-1]
    build = json.loads(next(cache.glob("tiny-qwen2-*/start_eval.json")).read_text())
    build_s = build["warmup_s"] + build.get("eval_s", 0.0)  # warm-up, then the start model's pass@k
    phases = {"build_tiny_model": build_s, **{k: round(v, 1) for k, v in s["phase_s"].items()}}
    # Ray and the actors starting, the weight sync before step 1, shutting down
    phases["other"] = round(wall - build_s - s["phase_s"].get("step", 0) - s["phase_s"].get("val", 0), 1)
    return {
        "seed": seed,
        "start_accuracy": start_acc,
        "end_accuracy": end_acc,
        "gain": end_acc - start_acc,
        "steps": end_step,
        "val_accuracy": s["val_accuracy"],
        "start_model": s["start_model"],
        "max_logprob_diff": s["max"].get("rollout/logprob_diff_max"),
        "wall_s": round(wall, 1),
        "phase_s": phases,
        "command": " ".join(cmd[1:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--recipe", default="quickstart")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*", help="more config overrides for every run")
    args = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "rlpost", "recipes", "configs"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip()
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            r = run_seed(seed, args.recipe, args.overrides, Path(tmp))
            results.append(r)
            print(
                json.dumps(
                    {k: r.get(k) for k in ("seed", "start_accuracy", "end_accuracy", "gain", "wall_s", "error")}
                ),
                flush=True,
            )
    ok = [r for r in results if "error" not in r]
    out = {
        "command": f"python benchmarks/quickstart_seeds.py --seeds {' '.join(map(str, args.seeds))} "
        f"--recipe {args.recipe} --out {args.out}" + (" " + " ".join(args.overrides) if args.overrides else ""),
        "commit": commit + ("+changes" if dirty else ""),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()},
        "summary": {
            "runs": len(results),
            "failed": len(results) - len(ok),
            "min_gain": min((r["gain"] for r in ok), default=None),
            "mean_gain": sum(r["gain"] for r in ok) / len(ok) if ok else None,
            "max_wall_s": max((r["wall_s"] for r in ok), default=None),
        },
        "runs": results,
    }
    Path(args.out).write_text(json.dumps(with_provenance(out), indent=1) + "\n")
    print(json.dumps(out["summary"]))


if __name__ == "__main__":
    main()
