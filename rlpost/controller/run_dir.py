"""A run folder belongs to one run. `claim_run_dir` makes it (or takes an existing one) for this
run: a lock file (`run.lock`: the pid and host of the run that holds it) refuses a second run in
the folder while the first lives, and a folder that holds another run's steps (metrics past step
0, checkpoints) is refused unless this run resumes it (`trainer.resume`) or replaces it
(`run.overwrite=true`, which deletes that run's logs and checkpoints; nothing else is deleted);
a `config.yaml` that is not a run's is the user's, and refused.
`release_run_dir` (`run_lock`) gives the lock back when the run ends."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
from datetime import datetime
from pathlib import Path

from rlpost.config import ConfigError, TrainConfig, to_yaml
from rlpost.controller.checkpoint import check_resume, complete_checkpoints
from rlpost.controller.resume_notes import config_missing, say_edited_config, say_lost_metrics
from rlpost.controller.run_lock import release_run_dir, take_lock
from rlpost.metrics.trackers import WANDB_RUNS

RUN_FILES = ("metrics.jsonl", "samples.jsonl", "summary.json", "curves.png", WANDB_RUNS)  # and checkpoints/ ...
# and in checkpoints/, tensorboard/ and profile/ what `run_trees` names, in wandb/ the W&B runs it recorded, which
# `wandb sync` would upload (`_delete_wandb_runs`)
HEADER = "# rlpost: this run's config, written by the run (a new run in this folder replaces it)\n"


def claim_run_dir(cfg: TrainConfig, log=print, restart: bool = False) -> Path:
    """The run folder of `cfg`, locked for this process, with this run's `config.yaml` (`restart`: the
    same run again after its actors died, from its newest checkpoint if it has one)."""
    if cfg.trainer.resume == "auto" and not cfg.run.dir:  # a new dated folder holds nothing (cat10's t46)
        raise ConfigError(
            "trainer.resume=auto looks for the newest checkpoint in run.dir, and run.dir is not set (this run "
            "would get a new folder, with none): give run.dir=<the run's folder>, or leave trainer.resume out"
        )
    run_dir = Path(cfg.run.dir or f"runs/{datetime.now():%Y%m%d_%H%M%S}").expanduser()
    try:  # (a name longer than the file system takes raised a raw OSError here: the eleventh catalogue's t80)
        run_dir = run_dir.resolve()  # (a symbolic-link loop raises RuntimeError in Python 3.11: cat20's t111)
        a_file = run_dir.exists() and not run_dir.is_dir()
    except (OSError, RuntimeError) as e:
        why = getattr(e, "strerror", None) or "a symbolic link in a loop"
        raise ConfigError(f"run.dir={str(run_dir)!r}: cannot use that path ({why}); choose another run.dir")
    if a_file:
        raise ConfigError(f"run.dir={str(run_dir)!r} is a file, not a folder; choose another run.dir")
    if cfg.trainer.resume == "auto" and not run_dir.exists():  # (the fifteenth catalogue's t62: ${now:...})
        log(f"trainer.resume=auto: run.dir={run_dir} is a new folder (not there before this run): nothing to resume")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        take_lock(run_dir, log)
    except OSError as e:  # a file where a folder of the path should be, no permission, read-only, a full disk
        raise ConfigError(f"run.dir={str(run_dir)!r}: cannot write there ({e.strerror}); choose another run.dir")
    try:
        check_run_files(run_dir)
        if (run_dir / "multirun.yaml").is_file():  # (the fifteenth catalogue's t51: a run trained beside the jobs)
            raise ConfigError(
                f"run.dir={str(run_dir)!r} is a sweep's folder (multirun.yaml): go on with the sweep (its `rlpost "
                "train -m ...` command with trainer.resume=auto), one of its runs (run.dir=<it>/0), or another run.dir"
            )
        elsewhere = resumes_elsewhere(cfg.trainer.resume, run_dir)
        # auto with nothing to go on from starts fresh: it would delete that run's logs (the fifteenth's t42)
        fresh = cfg.trainer.resume == "auto" and not restart and not complete_checkpoints(run_dir)
        if (cfg.trainer.resume == "none" or elsewhere or fresh) and holds_a_run(run_dir):
            if not cfg.run.overwrite:
                raise ConfigError(another_run(run_dir, cfg.trainer.resume, elsewhere, fresh))
            _delete_run(run_dir, log)
        check_resume(cfg, run_dir)  # before this run's config.yaml replaces the saving run's
        say_lost_metrics(cfg, run_dir, log)
        if cfg.trainer.save_every and (run_dir / "checkpoints").is_dir():
            check_writable(run_dir / "checkpoints")
        check_config_file(run_dir / "config.yaml")
        say_edited_config(cfg, run_dir, log)
        (run_dir / "config.yaml").write_text(HEADER + to_yaml(cfg))
    except BaseException:
        release_run_dir(run_dir)
        raise
    return run_dir


def another_run(run_dir: Path, resume: str, elsewhere: Path | None, fresh: bool) -> str:
    """Why a run folder that holds another run's steps is refused, and what to do."""
    there = [name for name in ("metrics.jsonl", "checkpoints/") if (run_dir / name).exists()]  # (cat17's t152)
    said = f"run.dir={str(run_dir)!r} holds another run's steps ({', '.join(there) or 'its logs'})"
    if elsewhere:
        said += f", and trainer.resume={resume} is a checkpoint of {elsewhere}: its steps would be written into "
        said += "that run's logs"
    if fresh or not complete_checkpoints(run_dir):  # nothing there to resume: no resume offered
        afresh = " (trainer.resume=auto would start afresh over them)" * fresh
        return (
            f"{said}, and no complete checkpoint to go on from{afresh}: choose another run.dir, or set "
            "run.overwrite=true to delete that run's logs and start again"
        )
    return (
        f"{said}: resume it with trainer.resume=auto, choose another run.dir, or set run.overwrite=true to delete that "
        "run's logs and checkpoints and start again"
    )


def resumes_elsewhere(resume: str, run_dir: Path) -> Path | None:
    """The run folder of `trainer.resume`'s checkpoint where that is a path into another folder
    than `run_dir` (the ninth catalogue's n69: resumed into a folder of a third run, the new steps
    went into its logs); None for `none`, `auto` and checkpoints of `run_dir` itself."""
    if resume in ("none", "auto"):
        return None
    path = Path(resume).expanduser().resolve()
    owner = path.parent.parent if path.name.startswith("step_") else path
    return None if owner == run_dir else owner


def check_config_file(path: Path) -> None:
    """A `config.yaml` already in the folder must be a run's (rlpost's sections at its top), else it
    is the user's own and is not replaced."""
    if not path.exists():
        return
    import yaml

    text = path.read_text(errors="replace")
    try:
        found = yaml.safe_load(text)
    except yaml.YAMLError:
        found = None
    sections = {f.name for f in dataclasses.fields(TrainConfig)}
    # a run's: the header runs write, or (written before the header) the main sections and no comment
    old_style = "#" not in text and {"run", "model", "data", "trainer", "algo"} <= set(found or ())
    if not (isinstance(found, dict) and set(found) <= sections and (text.startswith(HEADER) or old_style)):
        raise ConfigError(
            f"run.dir={str(path.parent)!r} holds a config.yaml that no rlpost run wrote, which a run would "
            "replace with its own: choose another run.dir (a new or empty folder)"
        )


def check_writable(folder: Path) -> None:
    """A file can be made in `folder` (the run's checkpoints/: one that could not failed at the first
    save, after the actors had started and steps had trained: the tenth catalogue's t43)."""
    import tempfile

    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise ConfigError(
            f"{folder}: cannot write there ({e.strerror}), and trainer.save_every writes the run's checkpoints "
            "there: make it writable, or choose another run.dir"
        ) from None


def check_run_files(run_dir: Path) -> None:
    """The files a run writes (`RUN_FILES`), where the folder has them, must be a run's: a run
    writes its `config.yaml` first, so without one they are someone else's; and every line of
    the logs must be a row rlpost wrote (a JSON object with its `step`), which a resumed run keeps
    or drops by step. A file that is not is named, with its line, and nothing is touched."""
    odd = [n for n in RUN_FILES if (run_dir / n).exists() and not (run_dir / n).is_file()]
    odd += ["checkpoints"] if (run_dir / "checkpoints").exists() and not (run_dir / "checkpoints").is_dir() else []
    if odd:
        raise ConfigError(
            f"run.dir={str(run_dir)!r} holds {', '.join(odd)} of another kind than a run writes there (a folder "
            "where a run writes a file, or a file where it writes its checkpoints/ folder): move it, or choose "
            "another run.dir"
        )
    found = [name for name in RUN_FILES if (run_dir / name).exists()]
    if found and not (run_dir / "config.yaml").exists():
        raise ConfigError(config_missing(run_dir, found, complete_checkpoints(run_dir)))
    for name in ("metrics.jsonl", "samples.jsonl"):
        path = run_dir / name
        lines = path.read_bytes().decode(errors="replace").splitlines() if path.is_file() else []
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line) if line.strip() else {"step": 0}
                ours = isinstance(row, dict) and isinstance(row.get("step"), int)
            except ValueError:
                ours = False
            if not ours:
                raise ConfigError(
                    f"run.dir={str(run_dir)!r}: {name} line {number} is not a row rlpost wrote ({line[:60]!r}); "
                    "a run keeps or drops that file's rows by step: remove the line (edited by hand?) or move the file"
                )


def holds_a_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run's steps: a checkpoint, or a metrics or samples row past step 0
    (samples alone: the metrics deleted, a new run would have trimmed them all away: the fourteenth
    catalogue's t33). Every metrics line is already a run's row (`check_run_files`); a samples line
    that is not a row counts as a run's."""
    if any(re.fullmatch(r"step_\d+", entry.name) for entry in (run_dir / "checkpoints").glob("step_*")):
        return True  # (a damaged one too; a copy kept beside them, step_10_best, is the user's: cat15's t41)
    for name in ("metrics.jsonl", "samples.jsonl"):
        path = run_dir / name
        lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
        if any(_step(line) > 0 for line in lines if line.strip()):
            return True
    return False


def _step(line: str) -> float:
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def _delete_run(run_dir: Path, log) -> None:
    """`run.overwrite=true`: the earlier run's logs, checkpoints, TensorBoard events and profiles go
    (what a run writes: `RUN_FILES`, and `run_trees`' entries by name); nothing else in the folder,
    and nothing through a link out of it (another run's checkpoints/, say: the eleventh catalogue's t75)."""
    trees = run_trees(run_dir)
    links = [folder for folder in trees if (run_dir / folder).is_symlink()]
    links += [  # one of its entries linked to another run's (the twelfth catalogue's t81)
        f"{folder}/{entry.name}"
        for folder, pattern in trees.items()
        if folder not in links
        for entry in sorted((run_dir / folder).glob(pattern))
        if entry.is_symlink()
    ]
    if links:
        where = ", ".join(f"{run_dir / f} -> {os.readlink(run_dir / f)}" for f in links)
        raise ConfigError(
            f"run.overwrite=true would delete through a link ({where}): rlpost deletes only what is in run.dir; "
            "remove the link (or what it points to) yourself, or choose another run.dir"
        )
    wandb_runs = _delete_wandb_runs(run_dir)  # (before WANDB_RUNS, which names them, goes)
    gone = [name for name in RUN_FILES if (run_dir / name).exists()] + wandb_runs
    for name in gone[: len(gone) - len(wandb_runs)]:
        (run_dir / name).unlink()
    kept = ["wandb"] if (run_dir / "wandb").is_dir() and any((run_dir / "wandb").iterdir()) else []
    kept += [f for f in ("tensorboard", "profile") if f not in trees and (run_dir / f).is_dir()]  # not its outputs
    for folder, pattern in trees.items():
        made = [entry for entry in sorted((run_dir / folder).glob(pattern)) if written_by_a_run(folder, entry)]
        for entry in made:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        gone += [f"{folder}/{pattern}"] if made else []
        if (run_dir / folder).is_dir():
            if any((run_dir / folder).iterdir()):
                kept.append(folder)  # what the run did not write there stays
            else:
                (run_dir / folder).rmdir()
    also = f"; kept what no run wrote in {', '.join(f'{k}/' for k in kept)}" if kept else ""
    did = f"deleted the earlier run's {', '.join(gone)}" if gone else "nothing a run wrote was left to delete"
    log(f"run.overwrite=true: {did} in {run_dir}{also}")


def run_trees(run_dir: Path) -> dict[str, str]:
    """The folders the run in `run_dir` wrote into, with the names it wrote there, by its config.yaml:
    checkpoints/ always; tensorboard/'s event files where its logger.backends had tensorboard, profile/'s
    files of its trainer.profile_step (the sixteenth catalogue's t141: a user's event file and notes went
    by pattern from a run that wrote neither)."""
    from rlpost.controller.checkpoint import run_config

    trees = {"checkpoints": "*step_*"}
    try:
        saved = run_config(run_dir)
    except (ConfigError, FileNotFoundError):  # (what it wrote is not known: only its checkpoints go)
        return trees
    if "tensorboard" in saved.logger.backends:
        trees["tensorboard"] = "events.out.tfevents.*"
    if saved.trainer.profile_step:
        trees["profile"] = f"update_step{saved.trainer.profile_step}_rank*"
    return trees


def _delete_wandb_runs(run_dir: Path) -> list[str]:
    """The W&B runs the earlier run recorded (`WANDB_RUNS`) go from wandb/, with W&B's links into them
    (`latest-run`, `debug.log`); the user's own W&B runs and files there stay (the sixteenth
    catalogue's t88: every entry of wandb/ went, an evaluation's unsynced offline run with them)."""
    record, folder = run_dir / WANDB_RUNS, run_dir / "wandb"
    names = set(record.read_text().split()) if record.is_file() else set()
    made = [folder / n for n in sorted(names) if (folder / n).is_dir() and not (folder / n).is_symlink()]
    for entry in made:
        shutil.rmtree(entry)
    for link in [e for e in folder.iterdir() if e.is_symlink()] if folder.is_dir() else []:  # latest-run, debug.log
        if names & set(Path(os.readlink(link)).parts):
            link.unlink()
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    return [f"wandb/{entry.name}" for entry in made]


def written_by_a_run(folder: str, entry: Path) -> bool:
    """A checkpoint is a run's when it holds the controller's state (`step_N/controller.pt`), or is
    one being written (`.tmp_step_N`); anything else in checkpoints/ (an export put there) is not.
    In the other folders `run_trees`' names are the run's."""
    if folder != "checkpoints":
        return True
    # the names a run writes, exactly: a copy kept beside them (step_10_best) is the user's (the fifteenth's t41)
    checkpoint = re.fullmatch(r"step_\d+", entry.name) is not None and (entry / "controller.pt").exists()
    return checkpoint or re.fullmatch(r"\.tmp_step_\d+", entry.name) is not None
