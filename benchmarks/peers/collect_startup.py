#!/usr/bin/env python3
"""Issue 43: startup.sh's archives (startup.tar.gz, or their folders) as one JSON: each part's seconds
(startup.py's records), vLLM's own phase lines from each engine's log, where each engine's seconds went
by its sampled stacks (`stack_s`: 0.2 s a sample, bucketed by the innermost phase it was in), and the
start-up line and vLLM phase lines of an rlpost_fast job run with VLLM_LOGGING_LEVEL=INFO.

    python benchmarks/peers/collect_startup.py startup.tar.gz [more.tar.gz ...] [--job rlpost_fast.log] \\
        --out benchmarks/peers/startup_h200.json --command "COMMIT=... bash benchmarks/peers/startup.sh"
"""

from __future__ import annotations

import argparse
import json
import re
import tarfile
import tempfile
from pathlib import Path

# a sample's phase: the first of these whose marker is on its stack (innermost phases first)
PHASES = [
    ("sampler warmup: Triton compiling", ("warmup_kernels",), ("_do_compile",)),
    ("sampler warmup: running", ("warmup_kernels",), ()),
    ("CUDA graph capture", ("capture_model",), ()),
    ("loading weights", ("load_model",), ()),
    ("torch.compile", ("_dynamo/", "_inductor/", "compilation/"), ()),
    ("generate", (":generate",), ()),
    ("engine: other", ("llm.py",), ()),
    ("imports", ("<frozen importlib",), ()),
]
VLLM_LINE = re.compile(r"(torch\.compile took|Graph capturing finished|init engine|Model loading took|Directly load)")


def phase(stack: list[str]) -> str:
    for name, markers, inner in PHASES:
        if any(m in f for f in stack for m in markers) and all(any(i in f for f in stack) for i in inner):
            return name
    return "other"


def stack_seconds(path: Path, every_s: float = 0.2) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        name = phase(json.loads(line)[1])
        out[name] = round(out.get(name, 0.0) + every_s, 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def folder(path: Path, tmp: Path) -> Path:
    if path.is_dir():
        return path
    with tarfile.open(path) as tar:
        tar.extractall(tmp / path.stem, filter="data")
    return next((tmp / path.stem).glob("*/parts.jsonl")).parent


def collect(w: Path) -> dict:
    read = lambda name: (w / name).read_text().strip()  # noqa: E731
    parts = [json.loads(x) for x in read("parts.jsonl").splitlines()]
    for p in parts:
        if p["part"] == "engine":
            log, stacks = w / f"engine_{p['variant']}.log", w / f"engine_{p['variant']}.stacks.jsonl"
            p["vllm_lines"] = [x[:200] for x in log.read_text().splitlines() if VLLM_LINE.search(x)]
            if stacks.exists():
                p["stack_s"] = stack_seconds(stacks)
    lines = read("machine.txt").splitlines()  # nvidia-smi's line per GPU, then the cores
    gpus = [x.split(",")[0] for x in lines if "MiB" in x]
    machine = f"{len(gpus)} x {gpus[0]}, {lines[-1]}" if gpus else ", ".join(lines)
    return {"commit": read("commit.txt"), "machine": machine, "date": read("date.txt"), "parts": parts}


def job(log: Path) -> dict:
    lines = [x.split("\t", 1) for x in log.read_text().splitlines() if "\t" in x]
    t0 = float(lines[0][0])
    keep = [[round(float(t) - t0, 1), x[:200]] for t, x in lines if VLLM_LINE.search(x) or "start-up " in x]
    return {"log": log.name, "seconds_since_first_line": keep}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archives", nargs="+", type=Path)
    ap.add_argument("--job", type=Path, action="append", default=[], help="a stamped rlpost job log (peers.sh)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", required=True, help="the commands that made the archives")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [collect(folder(p, Path(tmp))) for p in a.archives]
    first = runs[0]
    record = {k: first[k] for k in ("commit", "machine", "date")}
    record.update(command=a.command, runs=runs, jobs=[job(p) for p in a.job])
    a.out.write_text(json.dumps(record, indent=1) + "\n")
    for r in runs:
        for p in r["parts"]:
            seconds = {k: round(v, 1) for k, v in p.items() if k.endswith("_s") and k != "stack_s"}
            print(r["commit"], p["part"], p.get("variant", ""), seconds)
            if "stack_s" in p:
                print("   ", p["stack_s"])


if __name__ == "__main__":
    main()
