"""What one weight sync carries: its kind. The controller picks the kinds of each sync; trainer
and rollouts build their manifests for a kind independently, so a mismatch is refused before any
tensor moves (`rlpost.weightsync.sync`).

    full     the plain parameters (no LoRA)
    merged   W + (alpha/r) B A under the base model's names (model.lora.mode=merge)
    base     the frozen base weights without the adapter (model.lora.mode=adapter, first sync)
    adapter  lora_A/lora_B only (model.lora.mode=adapter), as float32 masters
"""

from __future__ import annotations

SYNC_KINDS = ("full", "merged", "base", "adapter")


def sync_kinds(cfg, first: bool) -> list[str]:
    """The syncs, in order, that bring the rollouts to the trainer's policy (`cfg`: a
    TrainConfig). `first`: the first sync of a run or after a resume, when the rollouts hold only
    what they loaded from `model.path`; in adapter mode it sends the base, then the adapter (after
    a resume the adapter is not zero), and every later sync the adapter only."""
    lora = cfg.model.lora
    if lora.rank <= 0:
        return ["full"]
    if lora.mode == "merge":
        return ["merged"]
    return ["base", "adapter"] if first else ["adapter"]
