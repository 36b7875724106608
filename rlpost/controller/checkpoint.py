"""Checkpoint folders: written under a temporary name, renamed when complete.

`<run dir>/checkpoints/step_<N>/` holds the trainer's sharded model and optimizer
(torch.distributed.checkpoint), each trainer rank's RNG and scheduler, the critic's alike when the
algorithm has one (`critic/`), and `controller.pt`
(step, weight version, dataloader position, controller RNG). A folder without the `step_` name is
incomplete and never resumed from. With LoRA the sharded model is the adapter only (the base is
`model.path`), and `adapter/` holds it as a peft adapter folder too.

`manifest.json`, written last, lists every file with its size: `damage` finds a checkpoint whose
file went missing or was cut short (a full disk, a preempted copy), and `resume=auto` falls back
to the newest intact one.

`rlpost.controller.export` turns a checkpoint into a Hugging Face model folder (`rlpost export`).
"""

from __future__ import annotations

import copy
import errno
import json
import pickle
import re
import shutil
import zipfile
import zlib
from pathlib import Path

import torch

from rlpost.controller.files import os_error_in
from rlpost.metrics.summary import sweep_hint

_COMPLETE = re.compile(r"^step_(\d+)$")


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    folder = checkpoints_dir(run_dir)
    found = [p for p in folder.glob("step_*") if _COMPLETE.match(p.name) and (p / "controller.pt").is_file()]
    return sorted(found, key=lambda p: int(_COMPLETE.match(p.name).group(1)))


MANIFEST = "manifest.json"


class CheckpointError(OSError):
    """A checkpoint could not be written (the message names it and the newest complete one)."""


def damage(folder: Path) -> str | None:
    """What is wrong with a complete-looking checkpoint folder, or None: its manifest is missing,
    or a file it lists is missing or has another size."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return f"no {MANIFEST}"
    try:
        listed = json.loads(manifest.read_bytes())
    except ValueError:  # not JSON, not UTF-8: written by hand, or cut short
        return f"{MANIFEST} is not valid JSON"
    if not isinstance(listed, dict) or not all(isinstance(size, int) for size in listed.values()):
        return f"{MANIFEST} is not a map of file names to sizes"
    for name, size in listed.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {size}"
    return controller_damage(folder / "controller.pt")


def controller_damage(path: Path) -> str | None:
    """`controller.pt` (a zip archive, as torch.save writes) checked against its own checksums: a
    file damaged at the same size passes the manifest's sizes, not these."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError):  # a damaged header
        return f"{path.name} is not a readable torch file"
    return f"{path.name} is damaged ({bad} fails its checksum)" if bad else None


def save(run_dir: Path, step: int, controller_state: dict, groups: list, keep: int, base: str | None = None) -> Path:
    """Every group's checkpoint (the actor's `trainer/`, a critic's `critic/`) and the
    controller's state into `step_<step>/`, renamed when complete; only `keep` are kept. `base`: a
    LoRA run's base weights (`weights_fingerprint`), in `base.json` (`check_base`)."""
    root = checkpoints_dir(run_dir)
    tmp, final = root / f".tmp_step_{step}", root / f"step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for group in groups:
            group.call("save_checkpoint", str(tmp))
        torch.save(controller_state, tmp / "controller.pt")
        if base is not None:
            (tmp / "base.json").write_text(json.dumps({"weights": base}))
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        (tmp / MANIFEST).write_text(json.dumps({str(p.relative_to(tmp)): p.stat().st_size for p in files}, indent=0))
    except Exception as e:  # a full disk, a lost mount: say so, leave the older checkpoints as they are
        shutil.rmtree(tmp, ignore_errors=True)
        cause = getattr(e, "cause", None) or e  # a Ray task error carries the actor's exception
        older, disk = complete_checkpoints(run_dir), os_error_in(e)
        why = f"{type(disk or cause).__name__}: {disk or cause}"
        full = disk is not None and disk.errno in (errno.ENOSPC, errno.EDQUOT)
        then = "trainer.resume=auto" if older else "run.overwrite=true (no checkpoint to go on from)"  # (cat19's t68)
        raise CheckpointError(
            f"writing checkpoint {final} failed: {why}; the newest complete checkpoint is "
            f"{older[-1] if older else 'none'}" + (f"; free space there, then run again with {then}" if full else "")
        ) from e
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in complete_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def resume_hint(folder: Path) -> str:
    """The checkpoint near `folder`, which is none: a run folder, a run's checkpoints/ folder, or a part
    of one checkpoint (its trainer/: the sixteenth catalogue's t174, t176)."""
    if (folder / "checkpoints").is_dir():
        return " (a run folder: trainer.resume=auto with run.dir set to it)"
    done = complete_checkpoints(folder.parent) if folder.name == "checkpoints" else []
    if done:
        return f" (a run's checkpoints folder: give one of them, e.g. the newest, trainer.resume={done[-1]})"
    if (folder.parent / "controller.pt").is_file():
        return f" (a part of the checkpoint {folder.parent}: give that folder)"
    return ""


def find(run_dir: Path, resume: str, log=print) -> Path | None:
    """The folder `trainer.resume` points at: `auto` = the newest complete and intact one in the
    run (a damaged one is named and passed over)."""
    if resume == "auto":
        for folder in reversed(complete_checkpoints(run_dir)):
            problem = damage(folder)
            if problem is None:
                return folder
            log(f"checkpoint {folder} is damaged ({problem}); trying the one before it")
        return None
    folder = Path(resume).expanduser()
    if not (folder / "controller.pt").is_file():
        raise FileNotFoundError(
            f"trainer.resume={resume}: {folder} is not a complete checkpoint (no controller.pt){resume_hint(folder)}"
        )
    problem = damage(folder)
    if problem is not None:
        raise FileNotFoundError(f"trainer.resume={resume}: the checkpoint is damaged: {problem}")
    return folder


def load(folder: Path, groups: list) -> dict:
    """Every group's state from `folder`, then the controller's. A checkpoint the actors refuse
    (another model's shapes, another LoRA setting: their `ValueError`) is a `CheckpointError`
    that says why, not the actor's traceback."""
    import ray

    for group in groups:
        try:
            group.call("load_checkpoint", str(folder))
        except ray.exceptions.RayTaskError as e:
            if not isinstance(e.cause, ValueError):
                raise
            raise CheckpointError(f"{group.role} could not load checkpoint {folder}: {e.cause}") from None
    try:
        return torch.load(folder / "controller.pt", weights_only=False)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as e:  # damaged at the same size
        older = older_than(folder)
        raise CheckpointError(
            f"checkpoint {folder}: controller.pt could not be read ({type(e).__name__}: {str(e).splitlines()[0]}); "
            + (f"trainer.resume=auto passes over it, to {older[-1]}" if older else "no older one is left")
        ) from None


def load_intact(folder: Path, groups: list, auto: bool, log=print) -> tuple[Path, dict]:
    """(the folder loaded, `load`'s state). With `trainer.resume=auto` a checkpoint whose files the
    actors cannot read (damaged at the same size, which only reading finds) is passed over for the
    one before it, said (it was refused: the twelfth catalogue's recheck of t87)."""
    while True:
        try:
            return folder, load(folder, groups)
        except CheckpointError as e:
            older = older_than(folder)
            if not (auto and older and "could not be read" in str(e)):
                raise
            log(f"{e}\ntrainer.resume=auto: going on from the checkpoint before it, {older[-1]}")
            folder = older[-1]


def older_than(folder: Path) -> list[Path]:
    """The complete checkpoints of `folder`'s run before it, oldest first."""
    done = [p.resolve() for p in complete_checkpoints(folder.parent.parent)]
    return done[: done.index(folder.resolve())] if folder.resolve() in done else []


# what a checkpoint's tensors are of (alpha: the adapter acts as alpha / rank B A, the 18th catalogue's t57)
SHARED = ("model.path", "model.lora.rank", "model.lora.alpha", "model.lora.target_modules")
TINY_SHAPE = tuple(  # the tiny model's, when both runs have it
    f"model.tiny.{k}" for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
)


def check_base(folder: Path | None, base: str | None, model_path: str) -> None:
    """A LoRA checkpoint holds its adapter alone: the base weights under `model_path` must be those
    it was trained on (its `base.json`), else the adapter goes on (or is merged into) another model
    (the eighteenth catalogue's t17, t18: rewards 0 after a resume, without a word)."""
    from rlpost.config import ConfigError

    record = folder / "base.json" if folder is not None else None
    if base is None or record is None or not record.is_file():
        return
    if json.loads(record.read_text()).get("weights") != base:
        raise ConfigError(
            f"model.path={model_path!r}: its weights are not those {folder} was trained on (they changed on disk "
            "since: a new revision, a re-download or a re-conversion); the checkpoint holds the LoRA adapter alone: "
            "give the base model it was trained on"
        )


def check_resume(cfg, run_dir: Path) -> None:
    """Before any actor starts: the checkpoint `trainer.resume` goes on from must leave steps to
    train, and its run (that run's `config.yaml`, not yet overwritten) must have had this run's
    model (the tiny model's `model.tiny` shape too), LoRA and critic; else refuse, naming the keys
    (the actors would fail to load it, or nothing would train)."""
    from rlpost.algos.algorithms import ALGORITHMS
    from rlpost.config import ConfigError

    folder = find(run_dir, cfg.trainer.resume, log=lambda *_: None) if cfg.trainer.resume != "none" else None
    if folder is None:
        return
    step = int(_COMPLETE.match(folder.name).group(1))
    if cfg.trainer.total_steps <= step:
        raise ConfigError(
            f"trainer.resume={cfg.trainer.resume} goes on from {folder} (step {step}), at or past trainer.total_steps="
            f"{cfg.trainer.total_steps}: nothing is left to train; set trainer.total_steps above {step}"
        )
    check_branch(cfg, run_dir, folder, step)
    if not (folder.parent.parent / "config.yaml").is_file():
        return
    saved = run_config(folder.parent.parent)

    def get(c, key):
        for part in key.split("."):
            c = getattr(c, part)
        return list(c) if not isinstance(c, (str, int, float)) else c

    shared = SHARED + (TINY_SHAPE if saved.model.path == cfg.model.path == "tiny" else ())  # the tiny model's shape
    differ = [f"{k}={get(saved, k)!r} there, {get(cfg, k)!r} here" for k in shared if get(saved, k) != get(cfg, k)]
    had, has = ("critic" in ALGORITHMS.get(c.algo.name).roles for c in (saved, cfg))
    if had != has:
        differ.append(f"algo.name={saved.algo.name!r} there, {cfg.algo.name!r} here (a critic in one, not the other)")
    for role in ("trainer", "critic"):  # Adam's states: in DCP, or in the layerwise optimizer's files (cat9's n57-n59)
        was, now = (getattr(c, role).optim.offload for c in (saved, cfg))
        if (was == "layerwise") != (now == "layerwise"):
            differ.append(f"{role}.optim.offload={was!r} there, {now!r} here (layerwise keeps Adam's states apart)")
    for key in ("run.seed", "data.shuffle"):  # the epoch's order (the 11th catalogue's t85, the 18th's t13)
        was, now = get(saved, key), get(cfg, key)
        if was != now:
            differ.append(f"{key}={was} there, {now} here (mid-epoch, prompts would train twice or never)")
    if saved.algo.async_rollouts and not cfg.algo.async_rollouts:  # its drawn-ahead batches: only async reads them
        differ.append("algo.async_rollouts=true there, false here (the prompts it had drawn ahead would never train)")
    if differ:
        raise ConfigError(
            f"trainer.resume={cfg.trainer.resume}: {folder} was saved by a run with other settings: "
            f"{'; '.join(differ)}. Resume with that run's settings, or start a new run.dir"
        )


def check_branch(cfg, run_dir: Path, folder: Path, step: int) -> None:
    """A resume from a checkpoint of this run folder that newer ones follow would train a second
    history on top of the first: the newer checkpoints kept as this run's newest, the one it went
    on from rotated away, and `auto` later going on from the other history (the fourteenth
    catalogue's t10). Refused, with the ways on."""
    from rlpost.config import ConfigError

    if cfg.trainer.resume == "auto" or Path(run_dir).expanduser().resolve() != folder.parent.parent.resolve():
        return  # (auto goes on from the newest it can read: newer ones are damaged)
    newer = [p.name for p in complete_checkpoints(folder.parent.parent) if int(_COMPLETE.match(p.name).group(1)) > step]
    if newer:
        raise ConfigError(
            f"trainer.resume={cfg.trainer.resume} goes back to step {step} in its own run folder, where newer "
            f"checkpoints follow ({', '.join(newer)}): training on there would mix two histories. Resume into a new "
            f"folder (run.dir=NEW with this trainer.resume), go on from the newest (trainer.resume=auto), or move "
            f"{', '.join(newer)} out of {folder.parent} first"
        )


def check_data_place(cfg, loader) -> None:
    """The checkpoint `trainer.resume` goes on from must have counted `loader`'s rows (its place in
    them means nothing for others): refused here, with the data's own message, before the actors
    start and load it. A `controller.pt` that cannot be read is left to `load` to say."""
    if cfg.trainer.resume == "none":
        return
    folder = find(Path(cfg.run.dir or ".").expanduser().resolve(), cfg.trainer.resume, log=lambda *_: None)
    try:
        state = torch.load(folder / "controller.pt", weights_only=False)["loader"] if folder else None
    except Exception:  # noqa: BLE001  (any failure to read it is `load`'s to say, with what to do)
        return
    if state is not None:
        copy.copy(loader).load_state_dict(state)


# ---------------------------------------------------------------------------------------- export


def run_config(run_dir: Path, log=print):
    """The `TrainConfig` a run was started with (its `config.yaml`). Keys this rlpost does not have
    (another version's, one that removed them) are left out with a note: they could block every
    resume of that run (the nineteenth catalogue's t88); a known key's value that does not fit is refused."""

    path, run_dir = Path(run_dir) / "config.yaml", Path(run_dir)
    if not path.is_file():
        step = _COMPLETE.match(run_dir.name)  # a checkpoint folder given for its run (the ninth catalogue's n35)
        hint = f"; it is a checkpoint: give its run, {run_dir.parent.parent} --step {step.group(1)}" if step else ""
        if run_dir.name == "checkpoints" and (run_dir.parent / "config.yaml").is_file():  # (the fifteenth's t40)
            hint = f"; it is a run's checkpoints folder: give its run, {run_dir.parent}"
        hint = hint or sweep_hint(run_dir)
        raise FileNotFoundError(
            f"{path} not found: {run_dir} is not an rlpost run folder (`rlpost train` writes config.yaml into "
            f"run.dir){hint}"
        )
    from rlpost.controller.saved_config import read_config

    return read_config(path, log)


def select(run_dir: Path, step: int | None = None, log=print) -> Path:
    """The complete checkpoint of `step`, or the newest complete and intact one (a damaged one is
    named and passed over, as `find` does for a resume); a damaged `step` is refused, named."""
    done = complete_checkpoints(run_dir)
    steps = [int(_COMPLETE.match(p.name).group(1)) for p in done]
    if step is None:
        if not done:
            raise FileNotFoundError(
                f"no complete checkpoint in {checkpoints_dir(run_dir)} (a folder "
                "step_<N> with controller.pt); train with trainer.save_every=N"
            )
        folder = find(run_dir, "auto", log=log)
        if folder is None:
            raise FileNotFoundError(f"every checkpoint in {checkpoints_dir(run_dir)} is damaged (said above)")
        return folder
    folder = checkpoints_dir(run_dir) / f"step_{step}"
    if folder not in done:
        raise FileNotFoundError(
            f"{folder} is not a complete checkpoint (no such folder, or no "
            f"controller.pt in it); complete ones: steps {steps or 'none'}"
        )
    problem = damage(folder)
    if problem is not None:
        intact = [s for s, p in zip(steps, done) if damage(p) is None]
        raise FileNotFoundError(f"{folder} is damaged: {problem}; intact ones: steps {intact or 'none'}")
    return folder
