"""Batch filters and reward shaping: pure functions on the CPU.

A batch filter (`Algorithm.batch_filter`) says which prompt groups of a scored batch to train on;
the controller generates more prompts until the batch is full again (`algo.max_filter_rounds`).

- `dynamic_sampling` (DAPO, Yu et al. 2025): drop the groups whose rewards are all equal. With
  group-relative advantages they are all 0: such a group adds no gradient, only tokens to the
  loss's denominator.
- Soft overlong punishment (DAPO): with L = `rollout.max_response_length` and a buffer of
  B = `algo.overlong_buffer` tokens, a response of length l gets 0 for l <= L - B, then a penalty
  falling linearly to -`algo.overlong_penalty` at l = L: penalty * (L - B - l) / B.
- Overlong filtering (DAPO): a response truncated at the length limit (no EOS) gets no loss.
"""

from __future__ import annotations

from typing import Callable

import torch

from rlpost.registry import Registry

BatchFilter = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BATCH_FILTERS: Registry[BatchFilter | None] = Registry("batch filter", key="Algorithm.batch_filter")
BATCH_FILTERS.register("none", None)  # every group trains


def varied_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """[N] bool: True on the rows whose group's rewards are not all equal."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1 if len(inverse) else 0
    r = rewards.double()
    high = torch.full((groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, inverse, r, "amax")
    low = torch.full((groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, inverse, r, "amin")
    return (high > low)[inverse]


BATCH_FILTERS.register("dynamic_sampling", varied_groups)


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment [N] (<= 0) for response lengths [N]; 0 with no buffer."""
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    expected = max_length - buffer
    over = (lengths.double() - expected).clamp(min=0.0)
    return (-penalty * over / buffer).float()


def truncated(response_ids: torch.Tensor, response_mask: torch.Tensor, eos_id: int, max_length: int) -> torch.Tensor:
    """[N] bool: the responses that reached `max_length` tokens without ending in EOS."""
    lengths = response_mask.sum(-1)
    last = response_ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
    return (lengths >= max_length) & (last != eos_id)
