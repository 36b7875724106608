"""Scoring generated batches: the decoded responses through the reward function (a pool of worker
processes) and, when one is configured, the reward model's workers; the run stops when the reward
function fails on too many samples for too long (`RewardFailure`); a user's reward file that a reward
worker cannot load, said by `not_loaded` (at the start, and in a worker started during the run)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlpost.config import ConfigError, TrainConfig
from rlpost.data.batch import Batch
from rlpost.data.dataset import PromptRow
from rlpost.rewards import RewardInput
from rlpost.rewards.executor import Scores, WorkerStartError
from rlpost.rewards.model import combine
from rlpost.rewards.pool import RewardPool

if TYPE_CHECKING:  # (Ray's import is not the setup's: this module's `not_loaded` is)
    from rlpost.controller.cluster import WorkerGroup


class RewardFailure(RuntimeError):
    """Too many samples failed to score for too long: the reward function is broken."""


class Scorer:
    def __init__(
        self, cfg: TrainConfig, tokenizer, rewards: RewardPool, reward_models: WorkerGroup | None = None, log=print
    ):
        self.cfg, self.tokenizer, self.log = cfg, tokenizer, log
        self.rewards, self.reward_models = rewards, reward_models
        self.failing = 0  # consecutive training batches of which too many samples failed to score

    def score(self, rows: list[PromptRow], batch: Batch, n: int, rule_only: bool = False, interrupted=None):
        """(rewards [N], how many samples failed to score, the decoded responses). The reward is
        `reward.rule_weight` x the rule score + `reward.model.weight` x the reward model's score
        (when one is configured; its parts go into `batch` as `rule_scores` and `model_scores`);
        `rule_only`: the rule score alone (validation), with a mask of the samples that failed to score in
        place of the responses: validation counts them wrong whatever `reward.error_score` gives them (the
        nineteenth catalogue's t126: accuracy 1.000 at error_score=1 with 30 of 64 failed). A non-finite
        model score counts as an error and scores 0. `interrupted`: the reward pool gives up when it turns
        true (`Interrupted`)."""
        # (multi-turn: the reward function reads the model's last turn, its answer)
        starts = batch["last_turn_start"].tolist() if "last_turn_start" in batch else [0] * len(batch)
        responses = self.tokenizer.batch_decode(
            [ids[m][s:].tolist() for ids, m, s in zip(batch["response_ids"], batch["response_mask"], starts)],
            skip_special_tokens=True,
        )
        samples = [
            RewardInput(rows[i // n].prompt_text, text, rows[i // n].ground_truth, rows[i // n].data_source)
            for i, text in enumerate(responses)
        ]
        try:
            result = self.rewards.score(samples, interrupted)
        except WorkerStartError as e:  # a worker started during the run could not load a user's file
            raise not_loaded(self.cfg.reward.fn, e, self.cfg.reward.memory_mb, started=True) from None
        rule, errors = torch.tensor(result.scores, dtype=torch.float32), result.counts
        if result.first_error:
            kinds = ", ".join(f"{v} {k}" for k, v in errors.items() if v and k != "errors")
            first = result.first_error.splitlines()[-1]
            self.log(f"reward: {errors['errors']} samples failed{f' ({kinds})' if kinds else ''}; first: {first}")
        if rule_only:
            failed = torch.zeros(len(samples), dtype=torch.bool)
            failed[result.error_rows] = True
            return rule, errors, failed
        self._check_failures(result, len(samples))
        model = None
        if self.reward_models is not None:
            model = self.model_scores(samples)
            bad = ~torch.isfinite(model)
            if bad.any():
                first = int(bad.nonzero()[0, 0])
                self.log(f"reward model: {int(bad.sum())} non-finite scores this step (first: sample {first})")
                model = model.masked_fill(bad, 0.0)
                errors = {**errors, "errors": errors["errors"] + int(bad.sum())}
                errors["bad_values"] += int(bad.sum())
            batch["rule_scores"], batch["model_scores"] = rule, model
        reward = combine(rule, model, self.cfg.reward.rule_weight, self.cfg.reward.model.weight)
        if "env_reward" in batch:  # multi-turn: the environment's rewards of the episode's turns
            reward = reward + batch["env_reward"]
        return reward, errors, responses

    def _check_failures(self, result: Scores, samples: int) -> None:
        """Stop the run when more than `reward.max_error_fraction` of the samples failed to score
        in `reward.max_error_steps` training batches in a row."""
        r = self.cfg.reward
        self.failing = self.failing + 1 if result.counts["errors"] > r.max_error_fraction * samples else 0
        if self.failing >= r.max_error_steps:
            raise RewardFailure(
                f"{result.counts['errors']} of {samples} samples failed to score, more than "
                f"reward.max_error_fraction={r.max_error_fraction} for {self.failing} batches in a row "
                f"(reward.max_error_steps={r.max_error_steps}). The first, {result.first_error}"
            )

    def model_scores(self, samples: list[RewardInput]) -> torch.Tensor:
        """The reward model's score of each sample, the samples split over its workers."""
        k = len(self.reward_models)
        parts = [samples[i * len(samples) // k : (i + 1) * len(samples) // k] for i in range(k)]
        refs = [
            self.reward_models.submit(i, "score", [s.prompt for s in part], [s.response for s in part])
            for i, part in enumerate(parts)
            if part
        ]
        import ray

        from rlpost.roles.reward_model import ScoreFnError

        try:
            outs = self.reward_models.get(refs)
        except ray.exceptions.RayTaskError as e:  # the user's score_fn at fault, not a death (cat18's t43)
            if isinstance(e.cause, ScoreFnError):
                raise RewardFailure(str(e.cause)) from None
            raise
        return torch.tensor([x for out in outs for x in out], dtype=torch.float32)


def not_loaded(spec: str, error: RuntimeError, memory_mb: int = 0, started: bool = False) -> ConfigError:
    """A reward worker could not build `reward.fn`: the file's own error, from the traceback's last
    exception line on (numpy's ImportError goes on over several lines); under a memory cap an
    import that fails for want of memory names `reward.memory_mb`. `started`: a worker the run
    started after its first step (the file loaded at the start: the eleventh catalogue's t29)."""
    import re

    lines = str(error).strip().splitlines()
    named = [i for i, line in enumerate(lines) if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", line)]
    why = " ".join(line.strip() for line in lines[named[-1] if named else -1 :] if line.strip())[:1000]
    # an import that ran out of memory (numpy's C extensions: "PLEASE READ THIS"), not any ImportError (cat18's t59)
    memory = r"MemoryError|can't start new thread|cannot allocate memory|failed to map segment|static TLS|PLEASE READ"
    cap = (
        f" (under reward.memory_mb={memory_mb}, each reward worker's memory cap: one this low can stop the file's "
        "imports; raise it, or 0 for none)"
        if memory_mb and re.search(memory, str(error), re.IGNORECASE)
        else ""
    )
    if "attempted relative import" in why:
        cap = (
            "; rlpost runs the file by itself, not as a module of its package: import its neighbours absolutely "
            "(from helpers import x: the file's own folder is on the path)"
        )
    if started:
        return ConfigError(
            f"reward.fn={spec!r}: a reward worker started during the run could not load it: {why}{cap}; it loaded "
            "when the run started, so the file (or what it imports) has changed since: fix it, then go on with "
            "trainer.resume=auto"
        )
    return ConfigError(f"reward.fn={spec!r} could not be loaded: {why}{cap}")
