"""Batch production: prompts in, generated and scored batches out, over the rollout worker group.

Prompts are split over the rollout actors (groups stay whole) and the results come back in prompt
order. In split placement with `algo.max_staleness > 0` (one-step-off-policy) the batches of the
next steps are launched before the current one trains, so generation overlaps training; a batch
records the weight version that generated it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

import torch

from rlpost.config import TrainConfig
from rlpost.controller.cluster import WorkerGroup
from rlpost.controller.step import group_ids, sampling_params
from rlpost.data.batch import Batch
from rlpost.data.dataset import PromptLoader, PromptRow
from rlpost.data.padding import check_masks, concat_generations
from rlpost.rewards import RewardInput, score_samples
from rlpost.rollout.base import SamplingParams


@dataclass
class Pending:
    """A batch whose generation is under way: its prompts and the rollout actors' futures."""

    rows: list[PromptRow]
    refs: list


class Rollouts:
    def __init__(
        self, cfg: TrainConfig, group: WorkerGroup, loader: PromptLoader, pad_id: int, tokenizer, reward_fn, log=print
    ):
        self.cfg, self.group, self.loader, self.pad_id = cfg, group, loader, pad_id
        self.tokenizer, self.reward_fn, self.log = tokenizer, reward_fn, log
        self.overlap = cfg.cluster.placement == "split" and cfg.algo.max_staleness > 0
        self.pending: deque[Pending] = deque()

    def launch(self, rows: list[PromptRow], params: SamplingParams) -> list:
        k = len(self.group)
        per = [rows[i * len(rows) // k : (i + 1) * len(rows) // k] for i in range(k)]
        return [
            self.group.submit(i, "generate", [r.prompt_ids for r in part], replace(params, seed=params.seed + i))
            for i, part in enumerate(per)
            if part
        ]

    def gather(self, refs: list, num_prompts: int, n: int) -> Batch:
        import ray

        batch = concat_generations(ray.get(refs), self.pad_id)
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
        job = self.pending.popleft()
        batch = self.gather(job.refs, len(job.rows), cfg.rollout.n)
        if self.overlap:  # the next batches generate while this one trains
            while len(self.pending) < cfg.algo.max_staleness and step + 1 + len(self.pending) < cfg.trainer.total_steps:
                self._queue(step + 1 + len(self.pending))
        elif cfg.cluster.placement == "colocate":
            self.group.call("sleep")  # the trainer gets the device (vLLM on a GPU)
        return job.rows, batch

    def score(self, rows: list[PromptRow], batch: Batch, n: int):
        """(rewards [N], how many samples failed to score, the decoded responses)."""
        responses = self.tokenizer.batch_decode(
            [ids[m].tolist() for ids, m in zip(batch["response_ids"], batch["response_mask"])], skip_special_tokens=True
        )
        samples = [
            RewardInput(rows[i // n].prompt_text, text, rows[i // n].ground_truth, rows[i // n].data_source)
            for i, text in enumerate(responses)
        ]
        result = score_samples(samples, self.reward_fn, self.cfg.reward.kwargs)
        if result.first_error:
            self.log(f"reward errors this step: {result.errors} (first: {result.first_error})")
        return torch.tensor(result.scores, dtype=torch.float32), result.errors, responses

    def validate(self, rows: list[PromptRow], params: SamplingParams) -> dict[str, float]:
        """Accuracy and mean reward of `params` (one sample each) on the validation rows."""
        start = time.perf_counter()
        scores, errors, _ = self.score(rows, self.generate(rows, params), params.n)
        return {
            "val/accuracy": (scores >= 1.0).float().mean().item(),
            "val/reward_mean": scores.mean().item(),
            "val/reward_errors": float(errors),
            "val/size": float(len(scores)),
            "timing_s/val": time.perf_counter() - start,
        }

    # ------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The loader position and the batches generated but not trained yet (one-step-off-policy:
        by the weights before this step's), so that a resumed run trains on exactly what this one
        would have."""
        import ray

        return {"loader": self.loader.state_dict(), "pending": [(job.rows, ray.get(job.refs)) for job in self.pending]}

    def load_state_dict(self, state: dict) -> None:
        import ray

        self.loader.load_state_dict(state["loader"])
        self.pending = deque(Pending(rows, [ray.put(part) for part in parts]) for rows, parts in state["pending"])
