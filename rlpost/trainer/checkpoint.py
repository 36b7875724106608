"""The checkpoint of one FSDP2 engine, named by its role (`trainer` for the actor, `critic`):
`<name>/` (torch.distributed.checkpoint: the trainable parameters and the optimizer state,
sharded) and each rank's `<name>_rank<r>.pt` (the RNG, the schedule, the layerwise optimizer's
host states). With LoRA only the adapter is saved: the
frozen base comes from `model.path` again on resume."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
from pathlib import Path

import torch

from rlpost.trainer.optim import LayerwiseAdamW, reshard_host_states


def state_dicts(engine):
    """(model, optimizer, options) state dicts. With LoRA only the trainable parameters (the
    adapter): the frozen base comes from `model.path` again on resume. The layerwise
    optimizer keeps its host states in the per-rank file instead."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(ignore_frozen_params=engine.lora is not None)
    layerwise = isinstance(engine.optimizer, LayerwiseAdamW)
    model_sd, optim_sd = get_state_dict(engine.model, [] if layerwise else engine.optimizer, options=options)
    if options.ignore_frozen_params:  # it keeps a frozen weight under its tied name (lm_head)
        trainable = {n for n, p in engine.model.named_parameters() if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trainable}
    state = {"model": model_sd} if layerwise else {"model": model_sd, "optimizer": optim_sd}
    return state, options


def save_checkpoint(engine, folder: str) -> None:
    """`trainer/` (DCP: the trainable parameters and the optimizer state) and each rank's
    `trainer_rank<r>.pt` (RNG, scheduler, the layerwise optimizer's host states)."""
    import torch.distributed.checkpoint as dcp

    state, _ = state_dicts(engine)
    dcp.save(state, checkpoint_id=os.path.join(folder, engine.name))
    layerwise = isinstance(engine.optimizer, LayerwiseAdamW)
    torch.save(
        {
            "rng": torch.get_rng_state(),
            "scheduler": engine.scheduler.state_dict(),
            "optimizer": engine.optimizer.state_dict() if layerwise else None,
        },
        Path(folder) / f"{engine.name}_rank{engine.rank}.pt",
    )


def rank_files(engine, folder: str) -> list[Path]:
    """Every rank's file of this engine in the checkpoint, in rank order."""
    found = {int(p.stem.rsplit("_rank", 1)[1]): p for p in Path(folder).glob(f"{engine.name}_rank*.pt")}
    if sorted(found) != list(range(len(found))) or not found:
        raise FileNotFoundError(
            f"checkpoint {folder}: its {engine.name}_rank<r>.pt files are of ranks {sorted(found)}, not 0..N-1"
        )
    return [found[r] for r in range(len(found))]


def rank_state(engine, folder: str, layerwise: bool) -> dict:
    """This rank's file; when the checkpoint was saved by another number of ranks (DCP reshards
    the model and Adam's states), rank 0's schedule and RNG (the RNG then differs from an
    uninterrupted run's), and the layerwise optimizer's host states put together from every saved
    rank and cut for this one."""
    files = rank_files(engine, folder)
    if len(files) == engine.world_size:
        return torch.load(files[engine.rank], weights_only=False)
    state = torch.load(files[0], weights_only=False)
    if layerwise:
        saved = [torch.load(f, weights_only=False)["optimizer"]["host"] for f in files]
        hosts = reshard_host_states(saved, engine.optimizer.full_shapes(), engine.rank, engine.world_size)
        state["optimizer"] = {**state["optimizer"], "host": hosts}
    return state


def unreadable(name: str, error: str, kind: str) -> str:
    """Why a checkpoint's `name` state did not load: a tensor of another size or shape (another
    model's checkpoint), or anything else, which the same model's damaged files give (the eleventh
    catalogue's t87: random bytes in a `.distcp` file were blamed on the settings)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    shapes = [line for line in lines if "size" in line.lower() or "shape" in line.lower()]
    if shapes:
        return (
            f"its {name} state does not fit this model ({shapes[0][:300]}); resume with the model.path and "
            "model.lora settings of the run that saved it"
        )
    last = lines[-1][:300] if lines else kind
    return (
        f"its {name} state could not be read ({kind}: {last}): a file of it may be damaged; trainer.resume=auto "
        "passes over it to the run's checkpoint before it (or give that one's step_N folder with a new run.dir), "
        "or, if the checkpoint is another run's, resume with the model.path and model.lora settings of the run that "
        "saved it"
    )


def not_dcp_loader(record: logging.LogRecord) -> bool:
    return not record.pathname.endswith(os.path.join("checkpoint", "state_dict_loader.py"))


def load_checkpoint(engine, folder: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state, options = state_dicts(engine)
    root = logging.getLogger()  # DCP logs each metadata read it falls back from, traceback and all, on the root
    if not engine.cfg.logger.verbose:  # logger: said once below instead (the seventeenth catalogue's t59)
        root.addFilter(not_dcp_loader)
    try:
        dcp.load(state, checkpoint_id=os.path.join(folder, engine.name))
    except (Exception, CheckpointException) as e:  # noqa: BLE001  (DCP's is a BaseException, per rank)
        raise ValueError(unreadable(engine.name, str(e), type(e).__name__)) from None
    finally:
        root.removeFilter(not_dcp_loader)
    if options.ignore_frozen_params:  # the frozen base stays as loaded from model.path
        options = dataclasses.replace(options, strict=False)
    layerwise = isinstance(engine.optimizer, LayerwiseAdamW)
    result = set_state_dict(
        engine.model,
        [] if layerwise else engine.optimizer,
        model_state_dict=state["model"],
        optim_state_dict={} if layerwise else state["optimizer"],
        options=options,
    )
    trainable = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    missing = [k for k in result.missing_keys if k in trainable]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"checkpoint {folder}: trainable parameters {missing[:3]} not in it, or keys "
            f"{result.unexpected_keys[:3]} the model does not have"
        )
    try:  # (a damaged per-rank file: the seventeenth catalogue's t57, a traceback after the actors started)
        extra = rank_state(engine, folder, layerwise)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as e:
        raise ValueError(unreadable(f"{engine.name} per-rank", str(e), type(e).__name__)) from None
    torch.set_rng_state(extra["rng"])
    engine.scheduler.load_state_dict(extra["scheduler"])
    if layerwise:
        engine.optimizer.load_state_dict(extra["optimizer"])  # copied into the pinned buffers
