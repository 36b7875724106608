"""Learning-rate shapes, pure functions of the step: the trainer's schedule (`trainer.engine.lr_factor`)
and the tiny models' warm-ups (`rlpost.tiny`) share them."""

from __future__ import annotations

import math


def cosine(step: int, total: int, min_ratio: float) -> float:
    """Cosine decay from 1 to `min_ratio` over `total` steps."""
    progress = min(step / max(total, 1), 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
