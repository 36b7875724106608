"""Metrics of a trainer phase, accumulated over micro-batches and reduced over the trainer ranks.

Values may be Python floats or 0-d tensors on the device: tensors are accumulated on the device
and come to the host once, in `reduce` (one all-reduce of the sums, one of the extremes, one copy
back), so that recording a metric never waits for the GPU."""

from __future__ import annotations

import torch
import torch.distributed as dist


class Stats:
    """Sums with counts (reported as sum / count, or as the sum where the count is 0), maxima,
    minima, and plain values. `reduce` is a collective: every rank records every key."""

    def __init__(self, device):
        self.device = device
        self.sums: dict[str, list] = {}
        self.maxes: dict = {}
        self.mins: dict = {}
        self.values: dict[str, float] = {}

    def add(self, key, total, count):
        s = self.sums.get(key)
        if s is None:
            self.sums[key] = [total, count]
        else:
            s[0], s[1] = s[0] + total, s[1] + count

    def max(self, key, value):
        self.maxes[key] = value if key not in self.maxes else _pairwise(torch.maximum, max, self.maxes[key], value)

    def min(self, key, value):
        self.mins[key] = value if key not in self.mins else _pairwise(torch.minimum, min, self.mins[key], value)

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
        sums = sorted(self.sums)
        extremes = [(k, 1.0) for k in sorted(self.maxes)] + [(k, -1.0) for k in sorted(self.mins)]
        # the minima travel negated, so one MAX all-reduce takes both
        flat = [v for k in sums for v in self.sums[k]]
        flat += [sign * (self.maxes[k] if sign > 0 else self.mins[k]) for k, sign in extremes]
        out = dict(self.values)
        if not flat:
            return out
        t = torch.stack([self._tensor(v) for v in flat])
        head, tail = t[: 2 * len(sums)], t[2 * len(sums) :]
        if len(head):
            dist.all_reduce(head)
        if len(tail):
            dist.all_reduce(tail, op=dist.ReduceOp.MAX)
        values = torch.cat([head, tail]).tolist()  # the one copy to the host
        for i, k in enumerate(sums):
            total, count = values[2 * i], values[2 * i + 1]
            # count 0 marks a pure sum (e.g. skipped steps); else a mean over count
            out[k] = total / count if count else total
        for (k, sign), v in zip(extremes, values[2 * len(sums) :]):
            out[k] = sign * v
        return out

    def _tensor(self, v) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            return v.detach().to(self.device, torch.float64).reshape(())
        return torch.tensor(float(v), dtype=torch.float64, device=self.device)


def _pairwise(tensor_op, float_op, a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = (a, b) if isinstance(a, torch.Tensor) else (b, a)
        return tensor_op(a, b.to(a.dtype)) if isinstance(b, torch.Tensor) else tensor_op(a, torch.full_like(a, b))
    return float_op(a, b)
