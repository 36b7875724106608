"""Checkpoint folders: written under a temporary name, renamed when complete.

`<run dir>/checkpoints/step_<N>/` holds the trainer's sharded model and optimizer
(torch.distributed.checkpoint), each trainer rank's RNG and scheduler, and `controller.pt`
(step, weight version, dataloader position, controller RNG). A folder without the `step_` name is
incomplete and never resumed from.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch

_COMPLETE = re.compile(r"^step_(\d+)$")


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    folder = checkpoints_dir(run_dir)
    found = [p for p in folder.glob("step_*") if _COMPLETE.match(p.name) and (p / "controller.pt").is_file()]
    return sorted(found, key=lambda p: int(_COMPLETE.match(p.name).group(1)))


def save(run_dir: Path, step: int, controller_state: dict, trainers, keep: int) -> Path:
    root = checkpoints_dir(run_dir)
    tmp, final = root / f".tmp_step_{step}", root / f"step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainers.call("save_checkpoint", str(tmp))
    torch.save(controller_state, tmp / "controller.pt")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in complete_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def find(run_dir: Path, resume: str) -> Path | None:
    """The folder `trainer.resume` points at: `auto` = the newest complete one in the run."""
    if resume == "auto":
        done = complete_checkpoints(run_dir)
        return done[-1] if done else None
    folder = Path(resume).expanduser()
    if not (folder / "controller.pt").is_file():
        raise FileNotFoundError(f"trainer.resume={resume}: {folder} is not a complete checkpoint "
                                "(no controller.pt)")
    return folder


def load(folder: Path, trainers) -> dict:
    trainers.call("load_checkpoint", str(folder))
    return torch.load(folder / "controller.pt", weights_only=False)
