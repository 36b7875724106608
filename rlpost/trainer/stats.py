"""Metrics of a trainer phase, accumulated over micro-batches and reduced over the trainer ranks."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class Stats:
    """Sums with counts (reported as sum / count, or as the sum where the count is 0), maxima,
    minima, and plain values. `reduce` is a collective: every rank records every key."""

    def __init__(self, device):
        self.device = device
        self.sums: dict[str, list[float]] = {}
        self.maxes: dict[str, float] = {}
        self.mins: dict[str, float] = {}
        self.values: dict[str, float] = {}

    def add(self, key, total, count):
        s = self.sums.setdefault(key, [0.0, 0.0])
        s[0] += total
        s[1] += count

    def max(self, key, value):
        self.maxes[key] = max(self.maxes.get(key, -math.inf), value)

    def min(self, key, value):
        self.mins[key] = min(self.mins.get(key, math.inf), value)

    def set(self, key, value):
        self.values[key] = value

    def merge(self, out) -> None:
        """A loss's metrics (`rlpost.algos.policy_loss.LossOutputs`)."""
        for key, (total, count) in out.means.items():
            self.add(key, total, count)
        for key, value in out.maxes.items():
            self.max(key, value)
        for key, value in out.mins.items():
            self.min(key, value)

    def reduce(self) -> dict[str, float]:
        keys = sorted(self.sums)
        out = dict(self.values)
        if keys:
            t = torch.tensor([v for k in keys for v in self.sums[k]], dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            for i, k in enumerate(keys):
                total, count = t[2 * i].item(), t[2 * i + 1].item()
                # count 0 marks a pure sum (e.g. skipped steps); else a mean over count
                out[k] = total / count if count else total
        for table, op in ((self.maxes, dist.ReduceOp.MAX), (self.mins, dist.ReduceOp.MIN)):
            keys = sorted(table)
            if keys:
                t = torch.tensor([table[k] for k in keys], dtype=torch.float64, device=self.device)
                dist.all_reduce(t, op=op)
                out.update(dict(zip(keys, t.tolist())))
        return out
