"""The `RolloutEngine` protocol every generation backend implements, and its sampling settings."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from rlpost.data.batch import Batch
from rlpost.weightsync.manifest import Manifest


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    greedy: bool = False
    seed: int = 0
    ahead: bool = False  # decoded before the samples already queued where calls share an engine (validation)


class Pauser:
    """Generation and weight loads take turns in one engine (`algo.async_rollouts`: a sync runs on
    a thread of its own while a generation is under way). A load waits until the generation
    reaches its next pause point (`point`: between two decoding steps; an engine without one,
    until the generation ends), loads, and the generation goes on with the new weights: a
    partial rollout. Without a concurrent load `point` costs one attribute read."""

    def __init__(self):
        self._cond = threading.Condition()
        self._generating = False
        self._loads = 0

    @contextmanager
    def generating(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._loads)
            self._generating = True
        try:
            yield
        finally:
            with self._cond:
                self._generating = False
                self._cond.notify_all()

    def point(self) -> None:
        """Inside `generating`: let a waiting load in, and go on once it is done."""
        if not self._loads:
            return
        with self._cond:
            self._generating = False
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._loads)
            self._generating = True

    @contextmanager
    def loading(self):
        with self._cond:
            self._loads += 1
            self._cond.wait_for(lambda: not self._generating)
        try:
            yield
        finally:
            with self._cond:
                self._loads -= 1
                self._cond.notify_all()


class RolloutEngine(Protocol):
    """Generates responses and takes new weights.

    `generate` returns a generation-layout `Batch` (see `rlpost.data.batch`) with `prompt_ids`,
    `prompt_mask`, `response_ids`, `response_mask`, `rollout_logprobs` and `weight_version`; the n
    samples of prompt i are rows i*n .. i*n+n-1; it may add `token_versions` (`[N, R]`, the weight
    version that sampled each response token) where a sync can land mid-generation (`pauser`);
    `weight_version` is then each row's first token's. `rollout_logprobs` are the log-probs of the sampled
    tokens under the distribution they were sampled from: softmax(logits / temperature), restricted
    to the top-k tokens and then to the nucleus and renormalized when `top_k` / `top_p` are set
    (greedy: softmax(logits)). Without top-k/top-p that is the distribution the trainer scores; with
    them the gap is real, and truncated importance sampling (`algo.rollout_is`) corrects for it.
    """

    weight_version: int
    pauser: Pauser  # loads (`load_weights`, `load_adapter`) run inside `pauser.loading()`

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Batch: ...

    def weight_manifest(self) -> Manifest: ...

    def load_weights(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Consume every (name, tensor) of one sync (they arrive bucket by bucket)."""

    def loaded_tensor(self, name: str) -> torch.Tensor | None:
        """The tensor now held under `name`, or None where the engine keeps another layout."""

    # Adapter mode (model.lora.mode=adapter) only: the engine serves base + a LoRA adapter. Base
    # syncs go through load_weights (base names), adapter syncs through these (peft names).
    def adapter_manifest(self) -> Manifest: ...

    def load_adapter(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Consume every lora_A/lora_B tensor of one adapter sync; generation uses them next."""

    def loaded_adapter_tensor(self, name: str) -> torch.Tensor | None:
        """The adapter tensor now held under `name` (None: verified as received)."""
