"""Batch production: prompts in, generated and scored batches out, over the rollout worker group.

Prompts are split over the rollout actors (groups stay whole) and the results come back in prompt
order. In split placement with `algo.max_staleness > 0` (one-step-off-policy) the batches of the
next steps are launched before the current one trains, so generation overlaps training; a batch
records the weight version that generated it. With `algo.async_rollouts` the batches come from a
`Stream` (`controller/stream.py`) instead.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

import torch

from rlpost.config import Colocation, TrainConfig
from rlpost.controller.cluster import WorkerGroup
from rlpost.controller.scoring import Scorer
from rlpost.controller.step import env_metrics, group_ids, sampling_params, shape_rewards, timed
from rlpost.controller.stream import Scored, Stream
from rlpost.data.batch import Batch
from rlpost.data.dataset import PromptLoader, PromptRow
from rlpost.data.padding import check_masks, concat_generations
from rlpost.envs import EpisodeRow
from rlpost.rewards.executor import Interrupted
from rlpost.rewards.pool import RewardPool
from rlpost.rollout.base import SamplingParams


def _fill(rounds: list[Scored], keeps: list[torch.Tensor], wanted: int, n: int, pad_id: int) -> Scored:
    """One `Scored` of `wanted` groups: the kept groups of every round in order, then (past the
    round cap) the dropped ones."""
    kept = [(r, g) for r, k in enumerate(keeps) for g in k.nonzero()[:, 0].tolist()]
    dropped = [(r, g) for r, k in enumerate(keeps) for g in (~k).nonzero()[:, 0].tolist()]
    chosen = sorted((kept + dropped[: max(wanted - len(kept), 0)])[:wanted])
    rows, batches, scores, responses = [], [], [], []
    for r, part in enumerate(rounds):
        groups = [g for rr, g in chosen if rr == r]
        if not groups:
            continue
        index = [g * n + i for g in groups for i in range(n)]
        rows += [part.rows[g] for g in groups]
        batches.append(part.batch.select(index))
        scores.append(part.scores[index])
        responses += [part.responses[i] for i in index]
    batch = concat_generations(batches, pad_id)
    batch["group_ids"] = group_ids(len(rows), n)
    metrics = {
        "filter/rounds": float(len(rounds) - 1),
        "filter/kept_groups_first_round": float(keeps[0].sum()),
        "filter/dropped_groups": float(len(dropped)),
        "filter/filled_groups": float(max(wanted - len(kept), 0)),
    }
    errors = {kind: sum(part.errors[kind] for part in rounds) for kind in rounds[0].errors}
    return Scored(rows, batch, torch.cat(scores), errors, responses, metrics)


@dataclass
class Pending:
    """A batch whose generation is under way: its prompts and the rollout actors' futures."""

    rows: list[PromptRow]
    refs: list


class BusyClock:
    """The rollout actors' generation seconds, from the total so far that each stamps on its rows
    (`rollout_rank`, `rollout_life`, `rollout_busy_s`): `observe` takes them off a batch, `take`
    gives the seconds of generation seen since it was last called, over all actors. Each actor's
    life counts from 0 (a restarted actor is a new life); a total below one already seen of its
    life (calls that ran side by side, seen out of order) adds nothing."""

    def __init__(self):
        self.seen: dict[tuple[int, int], float] = {}
        self.new = 0.0

    def observe(self, batch: Batch) -> None:
        ranks, totals = batch.tensors.pop("rollout_rank", None), batch.tensors.pop("rollout_busy_s", None)
        lives = batch.tensors.pop("rollout_life", None)
        if ranks is None:
            return
        lives = torch.zeros_like(ranks) if lives is None else lives
        for rank, life in torch.stack([ranks, lives], -1).unique(dim=0).tolist():
            total, last = totals[(ranks == rank) & (lives == life)].max().item(), self.seen.get((rank, life), 0.0)
            self.new += max(0.0, total - last)
            self.seen[rank, life] = max(total, last)

    def take(self) -> float:
        new, self.new = self.new, 0.0
        return new


class Rollouts:
    def __init__(
        self,
        cfg: TrainConfig,
        group: WorkerGroup,
        loader: PromptLoader,
        pad_id: int,
        tokenizer,
        rewards: RewardPool,
        log=print,
        reward_models: WorkerGroup | None = None,
    ):
        self.cfg, self.group, self.loader, self.pad_id = cfg, group, loader, pad_id
        self.score = Scorer(cfg, tokenizer, rewards, reward_models, log).score
        self.overlap = Colocation.of(cfg).overlapping
        self.pending: deque[Pending] = deque()
        self.stream = Stream(self) if cfg.algo.async_rollouts else None
        self.busy = BusyClock()  # `perf/rollout_busy_s`
        self.interrupted = None  # () -> bool: a stop signal came (`Workers.start`); a step's scoring gives up

    def launch(self, rows: list[PromptRow], params: SamplingParams) -> list:
        """Each rollout actor generates a contiguous part of `rows`, every sample of each of its
        prompts (a group stays on one actor). An engine seeds sample j of its p-th prompt with
        `seed + p * n + j`; an actor's seed is offset by its first prompt's place in the batch, so
        every sample of the batch has a seed of its own, whatever the number of actors."""
        k = len(self.group)
        starts = [i * len(rows) // k for i in range(k + 1)]
        return [
            self.group.submit(i, *self._job(rows[a:b]), replace(params, seed=params.seed + a * params.n))
            for i, (a, b) in enumerate(zip(starts, starts[1:]))
            if b > a
        ]

    def _job(self, rows: list[PromptRow]) -> tuple:
        """A rollout actor's method and arguments for `rows`: generation, or with `env.name` the
        rows' multi-turn episodes."""
        prompts = [r.prompt_ids for r in rows]
        if self.cfg.env.name:
            return "run_episodes", [EpisodeRow(r.prompt_text, r.ground_truth, r.data_source) for r in rows], prompts
        return "generate", prompts

    def gather(self, refs: list, num_prompts: int, n: int) -> Batch:
        batch = concat_generations(self.group.get(refs), self.pad_id)
        self.busy.observe(batch)
        batch.tensors.pop("token_versions", None)  # (async rollouts read them: `Stream`)
        check_masks(batch)
        batch["group_ids"] = group_ids(num_prompts, n)
        return batch

    def generate(self, rows: list[PromptRow], params: SamplingParams) -> Batch:
        return self.gather(self.launch(rows, params), len(rows), params.n)

    def seed(self, step: int) -> int:
        """Sampling seed of the batch that trains step `step`."""
        return self.cfg.run.seed * 1_000_003 + step * 101

    def _queue(self, step: int) -> None:
        """Launch the generation of the batch of `step` (on the actors' current weights)."""
        rows = next(self.loader)
        self.pending.append(Pending(rows, self.launch(rows, sampling_params(self.cfg, self.seed(step)))))

    def next_batch(self, step: int) -> tuple[list[PromptRow], Batch]:
        """The prompts and generated batch that train step `step` + 1 (0-based `step` done so far).
        One-step-off-policy: the batches of the next steps are launched before this one trains."""
        cfg = self.cfg
        if not self.pending:
            self._queue(step)
        job = self.taken = self.pending.popleft()  # (put back where a signal stops its scoring: `next_scored`)
        batch = self.gather(job.refs, len(job.rows), cfg.rollout.n)
        if self.overlap:  # the next batches generate while this one trains
            while len(self.pending) < cfg.algo.max_staleness and step + 1 + len(self.pending) < cfg.trainer.total_steps:
                self._queue(step + 1 + len(self.pending))
        return job.rows, batch

    def more(self, step: int, round: int) -> tuple[list[PromptRow], Batch]:
        """An extra batch of new prompts for step `step` + 1 (a batch filter dropped groups), on
        the actors' current weights, with a seed of its own."""
        rows = next(self.loader)
        return rows, self.generate(rows, sampling_params(self.cfg, self.seed(step) + 7919 * round))

    def synced(self, steps: int) -> None:
        """The weights of `steps` trained steps reached the rollouts (async rollouts: more may start)."""
        if self.stream is not None:
            self.stream.top_up(synced=steps, taken=steps)

    def next_scored(self, step: int, keep_groups=None, version: int = 0) -> Scored:
        """The scored batch that trains step `step` + 1 (by the trainer at weight `version`), its
        `rewards` shaped (`shape_rewards`). With a batch filter (`keep_groups(rewards,
        group_ids)` -> [N] bool, e.g. DAPO's dynamic sampling) the groups it drops are replaced by
        groups of new prompts, at most `algo.max_filter_rounds` extra generations; past that the
        dropped groups fill the batch."""
        cfg, n, timing = self.cfg, self.cfg.rollout.n, {}
        if self.stream is not None:  # the wait, scoring as the units come (`timing_s/reward`) included
            with timed(timing, "gen"):
                out = self.stream.next(step, version)
        else:
            with timed(timing, "gen"):  # the wait: less when generation overlapped the last step
                rows, batch = self.next_batch(step)
            with timed(timing, "reward"):
                try:
                    out = Scored(rows, batch, *self.score(rows, batch, n, interrupted=self.interrupted))
                except Interrupted:  # a stop signal: the batch goes back, generated, into the checkpoint
                    self.pending.appendleft(self.taken)
                    raise
        if keep_groups is not None:
            with timed(timing, "filter"):
                out = self._filtered(step, out, keep_groups)
        out.batch["rewards"] = shape_rewards(out.batch, out.scores, cfg)
        if "model_scores" in out.batch:  # what each part of the reward said, over the kept samples
            rule, model = out.batch.tensors.pop("rule_scores"), out.batch.tensors.pop("model_scores")
            out.metrics.update(
                {
                    "reward/rule_mean": rule.mean().item(),
                    "reward/model_mean": model.mean().item(),
                    "reward/model_std": model.std().item() if len(model) > 1 else 0.0,
                }
            )
        out.metrics.update(timing)
        out.metrics["perf/rollout_busy_s"] = self.busy.take()
        return out

    def _filtered(self, step: int, first: Scored, keep_groups) -> Scored:
        cfg, n, wanted = self.cfg, self.cfg.rollout.n, self.cfg.data.train_batch_size
        rounds = [first]
        keeps = [keep_groups(shape_rewards(first.batch, first.scores, cfg), first.batch["group_ids"])[::n]]
        while sum(int(k.sum()) for k in keeps) < wanted and len(rounds) <= cfg.algo.max_filter_rounds:
            rows, batch = self.more(step, len(rounds))
            rounds.append(Scored(rows, batch, *self.score(rows, batch, n)))
            keeps.append(keep_groups(shape_rewards(batch, rounds[-1].scores, cfg), batch["group_ids"])[::n])
        return _fill(rounds, keeps, wanted, n, self.pad_id)

    def validate(self, rows: list[PromptRow], params: SamplingParams) -> dict[str, float]:
        """Accuracy and mean reward of `params` (one sample each) on the validation rows."""
        start = time.perf_counter()
        batch = self.generate(rows, replace(params, ahead=True))  # (async: before the queued samples)
        scores, errors, failed = self.score(rows, batch, params.n, rule_only=True)
        episodes = {f"val/env_{k[4:]}": v for k, v in env_metrics(batch).items()} if "env_turns" in batch else {}
        return {
            **episodes,
            "val/accuracy": ((scores >= 1.0) & ~failed).float().mean().item(),  # a failed sample is not right
            "val/reward_mean": scores.mean().item(),
            "val/score_max": scores.max().item() if len(scores) else 0.0,  # (accuracy counts a score >= 1 right)
            "val/reward_errors": float(errors["errors"]),
            "val/size": float(len(scores)),
            "timing_s/val": time.perf_counter() - start,
            "perf/val_busy_s": self.busy.take(),  # not the next step's: the step time leaves validation out
        }

    def pass_at_k(self, rows: list[PromptRow], params: SamplingParams) -> dict[str, float]:
        """`start/pass@k` for k = 1, 2, 4, ... up to `params.n` samples of each row, and n itself."""
        from rlpost.metrics.passk import pass_at_ks

        n = params.n
        scores, _, failed = self.score(rows, self.generate(rows, params), n, rule_only=True)
        self.busy.take()  # before the first step: not its generation
        right = ((scores >= 1.0) & ~failed).view(len(rows), n).tolist()
        ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64) if k <= n} | {n})
        return {f"start/{k}": v for k, v in pass_at_ks(right, ks).items()}

    # ------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The loader position and the batches generated but not trained yet (one-step-off-policy:
        by the weights before this step's), so that a resumed run trains on exactly what this one
        would have."""
        pending = [(job.rows, self.group.get(job.refs, done=False)) for job in self.pending]
        stream = {"stream": self.stream.state_dict()} if self.stream is not None else {}
        return {"loader": self.loader.state_dict(), "pending": pending, **stream}

    def load_state_dict(self, state: dict) -> None:
        import ray

        self.loader.load_state_dict(state["loader"])
        if self.stream is not None and "stream" in state:
            self.stream.load_state_dict(state["stream"])
        self.pending = deque(Pending(rows, [ray.put(part) for part in parts]) for rows, parts in state["pending"])
