"""The adapter a vLLM engine serves in adapter mode (`model.lora.mode=adapter`): each sync's
adapter is written as a peft folder (in memory-backed /dev/shm where there is one) that generation
names in a `LoRARequest` with an id of its own (vLLM caches adapters by id: a reused id would keep
serving the old adapter)."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator

import torch

from rlpost.rollout.vllm_weights import expected_adapter_manifest, shm_dir
from rlpost.weightsync.manifest import Manifest


class ServedAdapter:
    def __init__(self, lora, model_path: str, trust_remote_code: bool):
        self.lora, self.model_path = lora, model_path
        self.manifest: Manifest = expected_adapter_manifest(model_path, lora, trust_remote_code)
        self.request = None  # the LoRARequest generation runs with; None until the first sync
        self._dir: str | None = None
        self._saved: dict[str, torch.Tensor] = {}
        self._loaded = 0

    def load(self, named_tensors: Iterator[tuple[str, torch.Tensor]], core) -> None:
        """Write the adapter and serve it from the next generation on, under a new id (`core`:
        vLLM's engine, which forgets the old one)."""
        from safetensors.torch import load_file
        from vllm.lora.request import LoRARequest

        from rlpost.models.lora import save_adapter

        folder = tempfile.mkdtemp(prefix="rlpost-lora-", dir=shm_dir(sum(s.nbytes for s in self.manifest)))
        save_adapter(named_tensors, self.lora, folder, self.model_path)
        old_request, old_dir = self.request, self._dir
        self._loaded += 1
        self.request = LoRARequest(f"rlpost-{self._loaded}", self._loaded, folder)
        self._dir = folder
        # what vLLM will read: the checksums of the sync are taken of these
        self._saved = load_file(os.path.join(folder, "adapter_model.safetensors"))
        if old_request is not None:
            core.remove_lora(old_request.lora_int_id)  # False if already evicted
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)

    def tensor(self, name: str) -> torch.Tensor | None:
        """The tensor in the adapter file vLLM loads (vLLM reads the file at the next generate)."""
        return self._saved.get(name)

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
