"""Async rollouts (`algo.async_rollouts`, split placement): the rollout actors generate without
pause and the trainer takes the first complete batch.

The prompts are drawn a batch at a time (a *draw*) and split over the rollout actors as the
synchronous loop splits them (`Rollouts.launch`: actor i, seed `Rollouts.seed(draw)` + n times
its first prompt's place in the draw); each part is a *unit*, one rollout call. Each actor has up
to `DEPTH` units queued, so it never waits for the controller. While the controller waits for a
batch it scores each unit that has come back (its groups then wait in `ready`); a step trains the
oldest `data.train_batch_size` of them.

How far ahead: after the sync of step s (s steps trained), at most (s + 1 + `algo.max_staleness`)
batches of groups may have been handed out or be under way, AReaL's bound: a group starts at most
`max_staleness` versions before the step that trains it. A group overtaken by newer ones, or
whose generation spanned syncs (partial rollouts: `RolloutEngine.pauser`), can still lag more; its
first token's version decides, and `algo.stale_groups` generates it again (a unit of its own,
with a seed of its own) or drops it. With `max_staleness=0` nothing is generated before the
step's sync, and a step trains exactly the draw the synchronous loop would: the same weights.

The ledger (`state_dict`): the units not yet started or under way (kept whole: relaunched with
their seeds) and the groups generated but not trained (kept with their samples), beside the
loader's position. A resumed run trains every drawn prompt exactly once.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import ray
import torch

from rlpost.controller.cluster import wait_first
from rlpost.controller.step import group_ids, sampling_params
from rlpost.data.batch import Batch
from rlpost.data.dataset import PromptRow
from rlpost.data.padding import check_masks, concat_generations

DEPTH = 2  # units per rollout actor, side by side on vLLM (the next fills the batch in the last one's tail)


@dataclass
class Scored:
    """A generated, scored batch (a step's, or one rollout call's): its prompts, the batch, the
    scores, how many samples failed to score (by kind: `rlpost.rewards.executor.ERROR_KINDS`), the
    decoded responses, and what a batch filter or the stream did (`filter/*`, `async/*` metrics)."""

    rows: list[PromptRow]
    batch: Batch
    scores: torch.Tensor
    errors: dict[str, int]
    responses: list[str]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Unit:
    """One rollout call: `rows` of draw `draw` starting at its `first` row (the order in which
    groups train), generated with `seed`; `attempt` > 0 for a stale group generated again."""

    rows: list[PromptRow]
    draw: int
    first: int
    seed: int
    rank: int
    attempt: int = 0


@dataclass
class Group:
    """One prompt's samples, generated and scored: row `index` of `scored` (a `Scored` of its
    unit), its place in the draw order, and the weight version of its first token."""

    scored: Scored
    index: int
    order: tuple[int, int]
    version: int
    attempt: int


@dataclass
class StreamStats:
    regenerated: int = 0
    dropped: int = 0
    reward_s: float = 0.0  # time spent scoring since the last batch
    errors: dict = field(default_factory=dict)  # reward errors of the units scored since the last batch


class Stream:
    def __init__(self, rollouts):
        self.r = rollouts  # the `Rollouts` whose actors, loader, seeds and scoring this uses
        cfg = rollouts.cfg
        self.batch, self.n, self.k = cfg.data.train_batch_size, cfg.rollout.n, cfg.algo.max_staleness
        self.todo: deque[Unit] = deque()  # drawn, not started
        self.running: dict = {}  # ref -> Unit
        self.ready: list[Group] = []
        self.draws = 0
        self.stats = StreamStats()

    # ------------------------------------------------------------------------------ launching
    def outstanding(self) -> int:
        return len(self.ready) + sum(len(u.rows) for u in self.running.values())

    def top_up(self, synced: int, taken: int, starving: bool = False) -> None:
        """Start units while the bound allows: `synced` steps' weights are on the rollouts,
        `taken` batches were handed out. `starving`: nothing is under way and the batch is not
        complete (groups were dropped): one more unit starts whatever the bound."""
        room = (synced + 1 + self.k - taken) * self.batch - self.outstanding()
        while True:
            if not self.todo and (room >= self.batch or starving):
                self._draw()
            if starving:
                room, starving = max(room, len(self.todo[0].rows)), False
            if not self.todo or len(self.todo[0].rows) > room:
                return
            unit = self.todo[0]
            per_actor = [sum(u.rank == rank for u in self.running.values()) for rank in range(len(self.r.group))]
            if unit.attempt:  # a regenerated group goes to the least busy actor
                unit.rank = min(range(len(per_actor)), key=per_actor.__getitem__)
            if per_actor[unit.rank] >= DEPTH:
                return
            self.todo.popleft()
            params = sampling_params(self.r.cfg, unit.seed)
            self.running[self.r.group.submit(unit.rank, *self.r._job(unit.rows), params)] = unit
            room -= len(unit.rows)

    def _draw(self) -> None:
        """The next batch of prompts, split over the actors as `Rollouts.launch` splits it."""
        rows, k, d = next(self.r.loader), len(self.r.group), self.draws
        self.draws += 1
        for i in range(k):
            lo, hi = i * len(rows) // k, (i + 1) * len(rows) // k
            if hi > lo:
                self.todo.append(Unit(rows[lo:hi], d, lo, self.r.seed(d) + lo * self.r.cfg.rollout.n, i))

    # ------------------------------------------------------------------------------- receiving
    def _take(self, ref) -> None:
        """Score the finished unit of `ref` into `ready`."""
        unit = self.running.pop(ref)
        batch = concat_generations(self.r.group.get([ref]), self.r.pad_id)
        self.r.busy.observe(batch)
        check_masks(batch)
        batch["group_ids"] = group_ids(len(unit.rows), self.n)
        start = time.perf_counter()
        scored = Scored(unit.rows, batch, *self.r.score(unit.rows, batch, self.n))
        self.stats.reward_s += time.perf_counter() - start
        for kind, count in scored.errors.items():
            self.stats.errors[kind] = self.stats.errors.get(kind, 0) + count
        first = batch["weight_version"].view(-1, self.n).min(-1).values.tolist()
        self.ready += [Group(scored, g, (unit.draw, unit.first + g), v, unit.attempt) for g, v in enumerate(first)]

    def next(self, step: int, version: int):
        """The `Scored` batch of step `step` + 1, for the trainer at weight `version`: waits for
        `data.train_batch_size` groups within the staleness bound (oldest first), with the
        group's deadlines (`cluster.stall_warn_s`, `cluster.stall_timeout_s`)."""
        start = time.monotonic()
        while True:
            self.top_up(synced=step, taken=step)
            self._handle_stale(version)
            if len(self.ready) >= self.batch:
                break
            if not self.running:  # (groups were dropped)
                self.top_up(synced=step, taken=step, starving=True)
            self._take(wait_first(list(self.running), start, self.r.group.labels, self.r.group.deadlines))
        if self.running:  # what else has come in meanwhile (older groups first)
            done, _ = ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
            for ref in done:
                self._take(ref)
            self._handle_stale(version)
        self.ready.sort(key=lambda g: g.order)
        chosen, self.ready = self.ready[: self.batch], self.ready[self.batch :]
        out = self._assemble(chosen, version)
        self.top_up(synced=step, taken=step + 1)  # the next batches start while this one trains
        return out

    def _handle_stale(self, version: int) -> None:
        stale = [g for g in self.ready if version - g.version > self.k]
        if not stale:
            return
        self.ready = [g for g in self.ready if version - g.version <= self.k]
        if self.r.cfg.algo.stale_groups == "drop":
            self.stats.dropped += len(stale)
            return
        self.stats.regenerated += len(stale)
        again = []  # each alone, with a seed of its own, before anything new
        for g in sorted(stale, key=lambda g: g.order):
            seed = self.r.seed(g.order[0]) + 7919 * (g.attempt + 1) + 97 * g.order[1] + 50_000_017
            again.append(Unit([g.scored.rows[g.index]], g.order[0], g.order[1], seed, 0, g.attempt + 1))
        self.todo.extendleft(reversed(again))

    def _assemble(self, chosen: list[Group], version: int):
        n, parts, rows, scores, responses = self.n, [], [], [], []
        for g in chosen:
            index = list(range(g.index * n, (g.index + 1) * n))
            parts.append(g.scored.batch.select(index))
            rows.append(g.scored.rows[g.index])
            scores.append(g.scored.scores[index])
            responses += [g.scored.responses[i] for i in index]
        batch = concat_generations(parts, self.r.pad_id)
        batch["group_ids"] = group_ids(len(rows), n)
        first = batch["weight_version"]
        mask = batch["loss_mask"]
        tokens = batch.tensors.pop("token_versions", None)
        spans = (
            ((tokens.masked_fill(~mask, -1).max(-1).values > first) & mask.any(-1)).float().mean().item()
            if tokens is not None
            else 0.0
        )
        errors, self.stats.errors = self.stats.errors, {}
        metrics = {
            "async/staleness_mean": (version - first).float().mean().item(),
            "async/partial_samples": spans,  # samples whose tokens came from more than one version
            "async/regenerated_groups": float(self.stats.regenerated),
            "async/dropped_groups": float(self.stats.dropped),
            "async/ready_groups": float(len(self.ready)),
            "async/generating_groups": float(sum(len(u.rows) for u in self.running.values())),
            "timing_s/reward": self.stats.reward_s,
        }
        self.stats.regenerated = self.stats.dropped = 0
        self.stats.reward_s = 0.0
        errors = {kind: errors.get(kind, 0) for kind in chosen[0].scored.errors}
        return Scored(rows, batch, torch.cat(scores), errors, responses, metrics)

    # ------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The ledger: units not started or under way (relaunched whole), groups generated and not
        trained (kept), the draws so far."""
        units = [*self.running.values(), *self.todo]
        return {"draws": self.draws, "units": units, "ready": self.ready}

    def load_state_dict(self, state: dict) -> None:
        self.draws = state["draws"]
        self.todo = deque(sorted(state["units"], key=lambda u: (u.draw, u.first)))
        self.ready = list(state["ready"])
