"""Offline tasks: problems generated locally and deterministically, no download needed.

`arithmetic`: two-operand integer addition written as ``"a+b="`` with ground truth ``"a+b"``'s
value. Every operand pair with ``digits`` digits is enumerated once, shuffled with a fixed seed,
and split: the first ``num_val`` pairs are held out for validation, the rest are training rows.
The split depends only on ``(digits, seed, num_val)``, so train and validation never overlap.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ARITHMETIC = "arithmetic"


def arithmetic_pairs(digits: int, seed: int) -> list[tuple[int, int]]:
    """All operand pairs with exactly `digits` digits (1 digit: 0..9), in a seeded order."""
    if digits < 1:
        raise ValueError(f"arithmetic task: digits must be >= 1, got {digits}")
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    hi = 10**digits
    pairs = [(a, b) for a in range(lo, hi) for b in range(lo, hi)]
    random.Random(seed).shuffle(pairs)
    return pairs


def arithmetic_row(a: int, b: int) -> dict:
    return {"prompt": f"{a}+{b}=", "ground_truth": str(a + b), "data_source": ARITHMETIC}


def arithmetic_split(digits: int, seed: int, num_val: int) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows) for the addition task."""
    pairs = arithmetic_pairs(digits, seed)
    if not 0 < num_val < len(pairs):
        raise ValueError(f"arithmetic task: num_val must be in 1..{len(pairs) - 1}, got {num_val}")
    val = [arithmetic_row(a, b) for a, b in pairs[:num_val]]
    train = [arithmetic_row(a, b) for a, b in pairs[num_val:]]
    return train, val


def write_jsonl(rows: list[dict], path: Path) -> Path:
    """Write rows atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)
    return path
