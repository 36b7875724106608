"""The `RolloutEngine` protocol every generation backend implements, and its sampling settings."""

from __future__ import annotations

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


class RolloutEngine(Protocol):
    """Generates responses and takes new weights.

    `generate` returns a generation-layout `Batch` (see `rlpost.data.batch`) with `prompt_ids`,
    `prompt_mask`, `response_ids`, `response_mask`, `rollout_logprobs` and `weight_version`; the n
    samples of prompt i are rows i*n .. i*n+n-1. `rollout_logprobs` are the log-probs of the sampled
    tokens under the distribution they were sampled from: softmax(logits / temperature), restricted
    to the top-k tokens and then to the nucleus and renormalized when `top_k` / `top_p` are set
    (greedy: softmax(logits)). Without top-k/top-p that is the distribution the trainer scores; with
    them the gap is real, and truncated importance sampling (`algo.rollout_is`) corrects for it.
    """

    weight_version: int

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
