"""What a resume is told about its folder before it starts: its metrics gone, or a `config.yaml` that
holds other settings than the resume's (each said, not refused: the run goes on with its own)."""

from __future__ import annotations

from pathlib import Path

from rlpost.config import ConfigError, TrainConfig
from rlpost.controller.checkpoint import find


class _Unset:
    def __repr__(self) -> str:
        return "(not set)"


UNSET = _Unset()  # a key one of the two configs does not have (a mapping's entry: reward.kwargs.method)


def say_lost_metrics(cfg: TrainConfig, run_dir: Path, log) -> None:
    """A resume in a folder whose metrics.jsonl is gone: said, with what it means (nothing was, and
    the summary counted only the new steps: the eleventh catalogue's t91)."""
    if cfg.trainer.resume == "none" or (run_dir / "metrics.jsonl").exists():
        return
    folder = find(run_dir, cfg.trainer.resume, log=lambda *_: None)
    if folder is not None and folder.parent.parent == run_dir:
        log(
            f"{run_dir / 'metrics.jsonl'} is missing: the steps up to {folder.name} are not in it; the rows start "
            "after it, and the run's summary and curves count only those"
        )


def say_edited_config(cfg: TrainConfig, run_dir: Path, log) -> None:
    """A resume whose settings are not the ones its folder's `config.yaml` holds: said, key by key
    (an edit of the file was taken for a setting, and rewritten without a word: the twelfth
    catalogue's t101). A run reads the command line and its recipe; the file only records them."""
    from rlpost.config import config_dict
    from rlpost.config.compose import leaves
    from rlpost.controller.checkpoint import run_config

    if cfg.trainer.resume == "none" or not (run_dir / "config.yaml").is_file():
        return
    try:
        saved = run_config(run_dir)
    except (ConfigError, FileNotFoundError):  # (a file that does not parse is refused where it is read)
        return
    there, here = (dict(leaves(config_dict(c))) for c in (saved, cfg))
    keys = [k for k in {**here, **there} if there.get(k, {}) != here.get(k, {})]  # a mapping's entries too
    differ = [f"{k}={there.get(k, UNSET)!r} there, {here.get(k, UNSET)!r} here" for k in keys]
    differ = [d for d in differ if not d.startswith(("trainer.resume=", "run.overwrite=", "run.dir="))]
    if differ:
        log(
            f"{run_dir / 'config.yaml'} held other settings than this resume's: {'; '.join(differ[:8])}"
            f"{f' (and {len(differ) - 8} more)' if len(differ) > 8 else ''}. A run takes its settings from the "
            "command line and its recipe, never from config.yaml, which now records this run's: to change a "
            "setting, give it on the command line"
        )


def config_missing(run_dir: Path, found: list[str], done: list[Path]) -> str:
    """Why a folder holding a run's files but no config.yaml takes no run: with complete checkpoints
    there it is a run whose config.yaml went (deleted, or not copied: the sixteenth catalogue's t160,
    said to hold files "that no rlpost run wrote", with no way on for the resume asked for)."""
    if done:
        return (
            f"run.dir={str(run_dir)!r} holds a run's checkpoints ({', '.join(p.name for p in done)}) and "
            f"{', '.join(found)}, but not its config.yaml (deleted, or not copied): put config.yaml back to go on "
            f"here, or go on in a new folder: trainer.resume={done[-1]} run.dir=NEW"
        )
    return (
        f"run.dir={str(run_dir)!r} holds {', '.join(found)} that no rlpost run wrote (it has no config.yaml), "
        "which a run would replace: choose another run.dir (a new or empty folder), or move them"
    )
