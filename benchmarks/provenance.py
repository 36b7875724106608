"""Where a benchmark's JSON came from, written by the driver itself (tests/test_provenance.py holds every
committed result to these keys): `commit` (the tree measured), `machine`, `command` and `date`.

    from provenance import provenance, with_provenance   # a driver in benchmarks/ (its folder is on sys.path)
    out = with_provenance(out)                            # the four keys on top; the driver's own values win

`commit` is `git rev-parse --short HEAD`, with "+dirty" when git sees tracked changes under rlpost/ or the
script's folder; where the tree has no git (a copy without .git, as on a GPU machine) it is the COMMIT
environment variable, else "unknown (why)". `machine` names the GPUs where torch sees CUDA, then the CPU
cores and model: "1 x NVIDIA H100 80GB HBM3, 16 CPU cores (AMD EPYC 9454)".
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def script_folder(repo: Path = REPO) -> list[str]:
    """The running script's folder inside `repo` (benchmarks/mutation for benchmarks/mutation/mutation.py),
    or none where the script lives elsewhere."""
    try:
        folder = Path(sys.argv[0]).resolve().parent.relative_to(repo.resolve())
    except (ValueError, OSError):
        return []
    return [folder.as_posix()] if folder.parts else []


def commit(repo: Path = REPO, folders: list[str] | None = None) -> str:
    """The short commit of `repo`'s HEAD, "+dirty" where tracked files under rlpost/ or `folders`
    (default: the running script's folder) changed; without git, $COMMIT or "unknown (why)"."""
    try:
        top = git(repo, "rev-parse", "--show-toplevel")
    except OSError as e:  # no git on this machine
        why = f"no git: {e.strerror}"
    else:
        if top.returncode == 0 and Path(top.stdout.strip()).resolve() == repo.resolve():
            head = git(repo, "rev-parse", "--short", "HEAD").stdout.strip()
            paths = ["rlpost", *(script_folder(repo) if folders is None else folders)]
            changed = git(repo, "status", "--porcelain", "--untracked-files=no", "--", *paths).stdout.strip()
            return head + ("+dirty" if changed else "")
        why = "not a git checkout" if top.returncode == 0 else (top.stderr.strip().splitlines() or ["git failed"])[-1]
    return os.environ.get("COMMIT") or f"unknown ({why}; set COMMIT)"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def gpus() -> str:
    """The GPUs torch sees, as "N x NAME" (empty without CUDA). torch is imported only where a driver
    already did or an NVIDIA driver is installed: a CPU-only script does not pay for it."""
    if "torch" not in sys.modules and not (Path("/proc/driver/nvidia").exists() or shutil.which("nvidia-smi")):
        return ""
    try:
        import torch
    except ImportError:
        return ""
    if not torch.cuda.is_available():
        return ""
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return ", ".join(f"{names.count(name)} x {name}" for name in dict.fromkeys(names))


def machine() -> str:
    cores = f"{os.cpu_count()} CPU cores ({cpu_model()})"
    found = gpus()
    return f"{found}, {cores}" if found else cores


def command_line() -> str:
    """The command this process was started with, as a shell would take it."""
    return " ".join(shlex.quote(a) for a in ["python3", *sys.argv])


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def provenance(command: str | None = None, repo: Path = REPO) -> dict:
    """The four keys: `command` is this process's command line unless a driver gives its own."""
    return {"commit": commit(repo), "machine": machine(), "command": command or command_line(), "date": utc_now()}


def with_provenance(record: dict, command: str | None = None) -> dict:
    """`record` with the four keys at its top: where it already has one (a driver's own command, or
    its machine as {"cpu": ..., "cores": ...}) its value stays; one it leaves None is filled in."""
    found = provenance(command)
    return {**found, **{k: v for k, v in record.items() if not (k in found and v is None)}}
