"""The verdicts of a weight sync, pure: whether two manifests agree, and after the closing
all-reduce (`rlpost.weightsync.sync`) which tensor, if any, some rank holds differently."""

from __future__ import annotations

from rlpost.weightsync.manifest import Manifest


def compare_manifests(expected: Manifest, received: Manifest) -> str | None:
    """None if they agree, else a message naming the first tensor that differs."""
    exp = {s.name: s for s in expected}
    rec = {s.name: s for s in received}
    missing = [n for n in exp if n not in rec]
    extra = [n for n in rec if n not in exp]
    if missing:
        return f"tensor {missing[0]!r} is expected but not sent ({len(missing)} missing)"
    if extra:
        return f"tensor {extra[0]!r} is sent but the receiver has no such tensor ({len(extra)} unknown)"
    for s in received:
        e = exp[s.name]
        if (e.shape, e.dtype) != (s.shape, s.dtype):
            return f"tensor {s.name!r}: sent shape {list(s.shape)} {s.dtype}, receiver has {list(e.shape)} {e.dtype}"
    return None


HEAD = 3  # the verdict's slots before the checksums: refused, short, part


def differs(values: list[int], n: int) -> int | None:
    """The first tensor whose highest and lowest checksum over all ranks differ, if any. `values`
    is the reduced verdict [refused, short, part, sent checksums (n), highest (n), ~lowest (n)]."""
    high, low = values[HEAD + n : HEAD + 2 * n], values[HEAD + 2 * n :]
    return next((i for i, (hi, lo) in enumerate(zip(high, low)) if hi != ~lo), None)
