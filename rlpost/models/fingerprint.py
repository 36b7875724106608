"""Which base weights a LoRA run trains on: a fingerprint of a local model folder's weight files
(names, sizes, each safetensors header and 16 slices of 64 KiB spread over each file), so that a
resume or an export finds a base that changed on disk since the run started (a new revision, a
re-download, a re-conversion: the eighteenth catalogue's t17, t18 merged the adapter into it, and
trained on it, without a word). Reading it costs about 1 MiB a file."""

from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.safetensors.index.json", "*.bin.index.json")
SLICES, SLICE_BYTES = 16, 64 * 1024


def weights_fingerprint(path: str) -> str | None:
    """The fingerprint of the weights in the local folder `path` (None: not a folder, or no weights)."""
    folder = Path(path).expanduser()
    files = sorted({f for pattern in WEIGHTS for f in folder.glob(pattern)}) if folder.is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with open(file, "rb") as f:
            for k in range(SLICES):
                f.seek(size * k // SLICES)
                digest.update(f.read(SLICE_BYTES))
    return digest.hexdigest()[:16]
