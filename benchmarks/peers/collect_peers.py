#!/usr/bin/env python3
"""Issue 43: the folders `peers.sh` leaves (one per seed: /tmp/peers/sSEED, or its peers_sSEED.tar.gz) as
one JSON: per job (rlpost colocated or split, TRL, verl; on 1 or 2 GPUs) and seed,

- `median_step_s` and `median_phase_s` over the steps after the first `--skip` (warm-up: compilation,
  CUDA graphs, the allocator's first growth). The phases are named alike for the three: `gen`
  (generation), `reward`, `logprob` (the old log-probs' forward), `update` (forward, backward and
  optimizer step of every micro-batch), `weight_sync` (trainer -> vLLM). What each framework's
  figure covers: rlpost `timing_s/*`; verl `timing_s/gen`, `reward`, `old_log_prob`, `update_actor`,
  `update_weights`; TRL from its profiling contexts (trl_grpo.py; its `update` is the step less
  `_prepare_inputs`);
- `gen_tokens_per_s`: the median over those steps of the step's generated response tokens over its
  generation seconds (rlpost split: the rollout engine's busy seconds, generation overlapping the update);
- `val`: [step, wall seconds since the job's command started, held-out greedy accuracy]; the wall time is
  when the accuracy line reached the job's stamped console log (peers.sh stamps every line), so
  start-up (Ray, model loading, vLLM's CUDA graphs) counts for all three alike;
- `time_to_target_s`: the first wall time at which the accuracy reached each target;
- `peak_gpu_gib`: the largest `memory.used` nvidia-smi reported on the job's GPUs during its window
  (sampled every 0.5 s: the whole GPU, vLLM and CUDA contexts included); `framework_peak_gib`: what the
  framework itself reports (rlpost `perf/update_peak_gb`; verl `perf/max_memory_allocated_gb` of the actor
  process; TRL `torch.cuda.max_memory_allocated` of its one process, vLLM's KV cache included).

With several folders, `by_job` also gathers each job's seeds: the mean of their median step times and
their validation curves side by side.

    python benchmarks/peers/collect_peers.py /tmp/peers/s0 [peers_s1.tar.gz ...] \\
        --out benchmarks/peers/peers_h100.json --command "COMMIT=... SEED=0 bash benchmarks/peers/peers.sh"
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: provenance
from provenance import with_provenance  # noqa: E402

PHASES = ("gen", "reward", "logprob", "update", "weight_sync")
RLPOST = {p: f"timing_s/{p}" for p in PHASES}
VERL = {"gen": "timing_s/gen", "reward": "timing_s/reward", "logprob": "timing_s/old_log_prob",
        "update": "timing_s/update_actor", "weight_sync": "timing_s/update_weights", "adv": "timing_s/adv"}  # fmt: skip
VAL_LINES = {  # the console line that reports a validation, per framework: (step, accuracy)
    "rlpost": re.compile(r"step (\d+): .*val/accuracy ([0-9.eE+-]+)"),
    "trl": re.compile(r'peers-val \{"step": (\d+), "accuracy": ([0-9.eE+-]+)'),
    "verl": re.compile(r"step:(\d+) - .*val-core/[^:]+/acc/mean@1:(?:np\.float64\()?([0-9.eE+-]+)"),  # numpy repr
}


def framework(job: str) -> str:
    return job.split("_")[0]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def json_lines(path: Path) -> list[dict]:
    """A JSON-lines file's rows; a line cut short (a job stopped at its deadline while writing) is left out."""
    rows = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_jobs(folder: Path) -> list[dict]:
    """peers.sh's jobs.tsv: name, GPUs, seed, start and end (epoch seconds), exit status, command."""
    keys = ("name", "gpus", "seed", "start", "end", "rc", "command")
    path = folder / "jobs.tsv"
    rows = [dict(zip(keys, line.split("\t", 6))) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        row.update(start=float(row["start"]), end=float(row["end"]), rc=int(row["rc"]), seed=int(row["seed"]))
    return rows


def stamped(path: Path) -> list[tuple[float, str]]:
    """A job's console log as (epoch seconds, line)."""
    out = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        stamp, _, text = line.partition("\t")
        try:
            out.append((float(stamp), text))
        except ValueError:
            continue
    return out


def val_times(lines: list[tuple[float, str]], kind: str, start: float) -> dict[int, tuple[float, float]]:
    """{step: (seconds since the job started, accuracy)} from the console's validation lines."""
    found = {}
    for stamp, text in lines:
        if m := VAL_LINES[kind].search(text):
            found.setdefault(int(m.group(1)), (round(stamp - start, 2), float(m.group(2))))
    return found


def rlpost_steps(run_dir: Path, samples: int) -> tuple[list[dict], dict[int, float], float | None]:
    """(step rows, {step: accuracy}, the largest `perf/update_peak_gb`) of an rlpost run folder."""
    by_step = {r["step"]: r for r in json_lines(run_dir / "metrics.jsonl") if "step" in r}  # the last row wins
    rows, steps = [by_step[k] for k in sorted(by_step)], []
    for r in rows:
        if r["step"] < 1 or "timing_s/step" not in r:
            continue
        tokens = r.get("response_length/mean", 0.0) * samples
        busy = r.get("perf/rollout_busy_s") or r.get("timing_s/gen")  # split: the engine's generation seconds
        phases = {p: r[k] for p, k in RLPOST.items() if k in r}
        steps.append({"step": r["step"], "step_s": r["timing_s/step"], "phases": phases, "gen_tokens": tokens,
                      "gen_tokens_per_s": tokens / busy if busy else None})  # fmt: skip
    vals = {r["step"]: r["val/accuracy"] for r in rows if "val/accuracy" in r}
    peaks = [r["perf/update_peak_gb"] for r in rows if "perf/update_peak_gb" in r]
    return steps, vals, max(peaks) if peaks else None


def trl_steps(run_dir: Path) -> tuple[list[dict], dict[int, float], float | None]:
    """The same from trl_grpo.py's trl_log.jsonl."""
    rows = json_lines(run_dir / "trl_log.jsonl")
    steps = [r for r in rows if r["event"] == "step"]
    vals = {r["step"]: r["accuracy"] for r in rows if r["event"] == "val"}
    peaks = [r["max_allocated_gib"] for r in rows if r.get("max_allocated_gib")]
    return steps, vals, max(peaks) if peaks else None


def verl_steps(run_dir: Path, samples: int) -> tuple[list[dict], dict[int, float], float | None]:
    """The same from verl's file logger (verl_metrics.jsonl: {"step", "data"} a line)."""
    rows = json_lines(run_dir / "verl_metrics.jsonl")
    steps, vals, peaks = [], {}, []
    for row in rows:
        d, step = row["data"], row["step"]
        acc = [v for k, v in d.items() if k.startswith("val-core/") and k.endswith("/acc/mean@1")]
        if acc:
            vals[step] = acc[0]
        peaks += [v for k, v in d.items() if k.endswith("perf/max_memory_allocated_gb")]  # actor/perf/...
        if "timing_s/step" not in d:
            continue
        tokens = d.get("response_length/mean", 0.0) * samples
        gen, phases = d.get("timing_s/gen"), {p: d[k] for p, k in VERL.items() if k in d}
        steps.append({"step": step, "step_s": d["timing_s/step"], "phases": phases, "gen_tokens": tokens,
                      "gen_tokens_per_s": tokens / gen if gen else None})  # fmt: skip
    return steps, vals, max(peaks) if peaks else None


def smi_peak(folder: Path, gpus: str, start: float, end: float) -> float | None:
    """The largest memory.used (GiB) of the job's GPUs that nvidia-smi reported in its window."""
    path, wanted = folder / "gpu_memory.txt", [int(g) for g in gpus.split(",")]
    best = None
    for line in path.read_text().splitlines() if path.is_file() else []:
        stamp, _, used = line.partition(" ")
        try:
            t, values = float(stamp), [float(x) for x in used.split(",")]
        except ValueError:
            continue
        if start <= t <= end:
            here = max(values[g] for g in wanted if g < len(values)) / 1024
            best = here if best is None else max(best, here)
    return best


def summarize_job(folder: Path, job: dict, samples: int, skip: int, targets: list[float]) -> dict:
    """One job's figures (the module's docstring says what each is)."""
    kind, run_dir = framework(job["name"]), folder / job["name"]
    steps, vals, own_peak = {"rlpost": lambda: rlpost_steps(run_dir, samples), "trl": lambda: trl_steps(run_dir),
                             "verl": lambda: verl_steps(run_dir, samples)}[kind]()  # fmt: skip
    timed = val_times(stamped(folder / f"{job['name']}.log"), kind, job["start"])
    curve = [[s, timed.get(s, (None,))[0], acc] for s, acc in sorted(vals.items())]
    kept = [s for s in steps if s["step"] > skip]
    phases = sorted({p for s in kept for p in s["phases"]})
    return {
        "framework": kind, "gpus": job["gpus"], "seed": job["seed"], "command": job["command"], "rc": job["rc"],
        "wall_s": round(job["end"] - job["start"], 1), "steps": len(steps), "steps_in_median": len(kept),
        "median_step_s": median(s["step_s"] for s in kept),
        "median_phase_s": {p: median(s["phases"].get(p) for s in kept) for p in phases},
        "gen_tokens_per_s": median(s["gen_tokens_per_s"] for s in kept),
        "val": curve, "time_to_target_s": {str(t): first_at(curve, t) for t in targets},
        "peak_gpu_gib": smi_peak(folder, job["gpus"], job["start"], job["end"]), "framework_peak_gib": own_peak,
    }  # fmt: skip


def first_at(curve: list, target: float) -> float | None:
    """The first wall time at which the accuracy reached `target` (None: never, or no time known)."""
    return next((wall for _, wall, acc in curve if acc >= target and wall is not None), None)


def machine_of(text: str | None) -> str | None:
    """peers.sh's machine.txt (nvidia-smi's "name, memory" a GPU, then the cores) as "N x NAME, C CPU cores"."""
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    gpus = [x.split(",")[0] for x in lines if "MiB" in x]
    cores = [x for x in lines if x.endswith("CPU cores")]
    named = [f"{gpus.count(g)} x {g}" for g in dict.fromkeys(gpus)]
    return ", ".join(named + cores) or None


def one_seed(folder: Path, skip: int, targets: list[float], leave_out: dict | None = None) -> dict:
    """Every job of one peers.sh folder (but those `leave_out` names as "FOLDER/JOB"), with its machine,
    versions and task."""
    task = json.loads((folder / "task" / "task.json").read_text())
    samples = task["settings"]["prompts_per_step"] * task["settings"]["group_size"]
    read = lambda name: (folder / name).read_text().strip() if (folder / name).is_file() else None  # noqa: E731
    kept = [j for j in read_jobs(folder) if f"{folder.name}/{j['name']}" not in (leave_out or {})]
    jobs = {j["name"]: summarize_job(folder, j, samples, skip, targets) for j in kept}
    return {
        "folder": folder.name, "commit": read("commit.txt"), "date": read("date.txt"),
        "machine": machine_of(read("machine.txt")), "versions": json.loads(read("versions.json") or "{}"),
        "task": {k: v for k, v in task.items() if k != "settings"}, "settings": task["settings"], "jobs": jobs,
        "shape": read("shape.txt") or None,  # SHAPE=: random weights of that shape, not SmolLM2 (throughput only)
    }  # fmt: skip


def by_job(seeds: list[dict], targets: list[float]) -> dict:
    """Each job over its seeds: the mean of the median step times, the curves side by side."""
    names = sorted({name for s in seeds for name in s["jobs"]})
    out = {}
    for name in names:
        runs = [s["jobs"][name] for s in seeds if name in s["jobs"]]
        mean = lambda xs: statistics.mean(xs) if xs else None  # noqa: E731
        out[name] = {
            "seeds": [r["seed"] for r in runs],
            "median_step_s_mean": mean([r["median_step_s"] for r in runs if r["median_step_s"] is not None]),
            "gen_tokens_per_s_mean": mean([r["gen_tokens_per_s"] for r in runs if r["gen_tokens_per_s"] is not None]),
            "peak_gpu_gib_max": max((r["peak_gpu_gib"] for r in runs if r["peak_gpu_gib"] is not None), default=None),
            "val_by_seed": {str(r["seed"]): r["val"] for r in runs},
            "time_to_target_s_by_seed": {str(t): [r["time_to_target_s"][str(t)] for r in runs] for t in targets},
        }
    return out


def common_target(seeds: list[dict], targets: list[float]) -> float | None:
    """The highest target that every job of every seed reached."""
    runs = [j for s in seeds for j in s["jobs"].values()]
    reached = [t for t in targets if runs and all(j["time_to_target_s"][str(t)] is not None for j in runs)]
    return max(reached, default=None)


def parse_leave_out(items: list[str]) -> dict[str, str]:
    """{"FOLDER/JOB": reason} from --leave-out FOLDER/JOB=REASON; a reason is required."""
    out = {}
    for item in items:
        job, _, reason = item.partition("=")
        if job.count("/") != 1 or not reason.strip():
            raise SystemExit(f"--leave-out {item!r}: want FOLDER/JOB=REASON (e.g. s0/rlpost_colocate=cut by its cap)")
        out[job] = reason.strip()
    return out


def unpacked(paths: list[Path], tmp: Path) -> list[Path]:
    """Folders as they are; peers_sSEED.tar.gz archives unpacked into `tmp`."""
    out = []
    for p in paths:
        if p.is_dir():
            out.append(p)
            continue
        with tarfile.open(p) as tar:
            tar.extractall(tmp / p.name, filter="data")
        out += [d for d in sorted((tmp / p.name).iterdir()) if d.is_dir()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="peers.sh folders (/tmp/peers/sSEED) or their .tar.gz")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--command", help="the command that made the folders (default: this one's)")
    ap.add_argument("--skip", type=int, default=3, help="steps left out of the medians (warm-up)")
    ap.add_argument("--targets", type=float, nargs="+", default=[0.4, 0.5, 0.6, 0.7, 0.8])
    ap.add_argument(
        "--leave-out",
        action="append",
        default=[],
        metavar="FOLDER/JOB=REASON",
        help="a job left out of the figures, with the reason (kept in the JSON's left_out)",
    )
    args = ap.parse_args()
    leave_out = parse_leave_out(args.leave_out)
    with tempfile.TemporaryDirectory() as tmp:
        folders = unpacked(args.folders, Path(tmp))
        if unknown := sorted(set(leave_out) - {f"{f.name}/{j['name']}" for f in folders for j in read_jobs(f)}):
            ap.error(f"--leave-out names no job of the folders: {', '.join(unknown)}")
        seeds = [one_seed(f, args.skip, args.targets, leave_out) for f in folders]
    first = seeds[0]
    record = with_provenance(
        {
            "commit": first["commit"] if first["commit"] not in (None, "unknown") else None,
            "date": first["date"],
            "machine": first["machine"],
            "command": args.command,
            "skip_steps": args.skip,
            "targets": args.targets,
            "common_target": common_target(seeds, args.targets),
            "left_out": [{"job": k, "reason": v} for k, v in leave_out.items()],
            "by_job": by_job(seeds, args.targets),
            "seeds": seeds,
        }  # fmt: skip
    )
    text = json.dumps(record, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    for name, job in record["by_job"].items():
        print(name, {k: job[k] for k in ("seeds", "median_step_s_mean", "gen_tokens_per_s_mean", "peak_gpu_gib_max")})
    print("common target", record["common_target"])


if __name__ == "__main__":
    main()
