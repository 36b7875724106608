"""The checkpoint of one FSDP2 engine, named by its role (`trainer` for the actor, `critic`):
`<name>/` (torch.distributed.checkpoint: the trainable parameters and the optimizer state,
sharded) and each rank's `<name>_rank<r>.pt` (the RNG, the schedule, the layerwise optimizer's
host states). With LoRA only the adapter is saved: the
frozen base comes from `model.path` again on resume."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from rlpost.trainer.optim import LayerwiseAdamW


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


def rank_file(engine, folder: str, layerwise: bool) -> Path:
    """This rank's file; when the checkpoint was saved by another number of ranks (DCP reshards
    the model and Adam's states) rank 0's (its schedule; the RNG then differs from an
    uninterrupted run's). The layerwise optimizer's host states are per rank: they need the same
    number of ranks."""
    saved = sorted(Path(folder).glob(f"{engine.name}_rank*.pt"))
    if layerwise and len(saved) != engine.world_size:
        raise ValueError(
            f"checkpoint {folder}: trainer.optim.offload=layerwise saved its Adam states by {len(saved)} ranks; "
            f"resume it with trainer.world_size={len(saved)} (not {engine.world_size})"
        )
    own = Path(folder) / f"{engine.name}_rank{engine.rank}.pt"
    return own if own.is_file() and len(saved) == engine.world_size else Path(folder) / f"{engine.name}_rank0.pt"


def load_checkpoint(engine, folder: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state, options = state_dicts(engine)
    dcp.load(state, checkpoint_id=os.path.join(folder, engine.name))
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
    extra = torch.load(rank_file(engine, folder, layerwise), weights_only=False)
    torch.set_rng_state(extra["rng"])
    engine.scheduler.load_state_dict(extra["scheduler"])
    if layerwise:
        engine.optimizer.load_state_dict(extra["optimizer"])  # copied into the pinned buffers
