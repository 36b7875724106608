"""`RewardPool.score(samples)` scores the samples of trusted scorers (rlpost's own, see
`REWARDS.register`) in this process and sends the others to a `WorkerPool` (`executor.py`); a
failed sample scores `reward.error_score` and is counted by kind, and the first error keeps its
traceback."""

from __future__ import annotations

import functools
import itertools
import math
import traceback
from typing import Callable

from rlpost.rewards.base import REWARDS, TRUSTED, RewardInput, check_call, get_reward_fn, is_trusted
from rlpost.rewards.executor import Result, Scores, WorkerPool
from rlpost.rewards.values import BadValue, checked


def _scorer(spec: str, kwargs: dict) -> Callable[[RewardInput], float]:
    """The reward pool's function, built in the worker: `reward.fn`, or the scorer of each
    sample's `data_source` (`auto`)."""
    fn = get_reward_fn(spec)
    if fn is not None:
        check_call(fn, kwargs, spec)

    def score(sample: RewardInput) -> float:
        if fn is None and sample.data_source not in REWARDS:
            raise KeyError(f"no reward function registered for data_source {sample.data_source!r}; set reward.fn")
        scorer = fn if fn is not None else REWARDS.get(sample.data_source)
        return checked(scorer(sample, **(kwargs if fn is not None else {})))

    return score


class RewardPool:
    """Scores with `reward.fn` = `spec` (and `kwargs`) in a `WorkerPool` of `workers`
    processes. Samples whose scorer is trusted (`REWARDS.register(..., trusted=True)`: rlpost's own)
    are scored in this process instead; the processes start when the first other sample comes."""

    def __init__(
        self,
        spec: str,
        kwargs: dict,
        workers: int,
        timeout_s: float,
        memory_mb: int,
        error_score: float,
    ):
        self.spec, self.kwargs, self.timeout_s, self.error_score = spec, dict(kwargs), timeout_s, error_score
        self.fn = get_reward_fn(spec) if spec in TRUSTED else None  # None: by data_source, or in the pool
        setup = functools.partial(_scorer, spec, self.kwargs)
        self.pool = WorkerPool(setup, workers, memory_mb, "reward", "reward.timeout_s")

    def load(self) -> None:
        """A user's file (`path.py:name`) runs now, in the first worker, which keeps it: an error
        the file raises as it runs (or a missing function) comes here, as a RuntimeError."""
        if ".py:" in self.spec:
            self.pool.wait_ready(0)

    def trusted(self, sample: RewardInput) -> bool:
        return is_trusted(self.spec, sample.data_source)

    def score(self, samples: list[RewardInput], interrupted=None) -> Scores:
        """Every sample's score; `interrupted`: as `WorkerPool.map` takes it (`Interrupted`)."""
        if self.spec in TRUSTED:  # all of them here, checked as one batch when nothing fails
            scores = self._all_here(samples)
            if scores is not None:
                return Scores(scores=scores)
        out = Scores(scores=[self.error_score] * len(samples))
        rows = [j for j, sample in enumerate(samples) if not self.trusted(sample)]  # those for the pool
        if len(rows) < len(samples):
            self._score_here(samples, sorted(set(range(len(samples))) - set(rows)), out)
        if rows:
            rows = interleaved(rows, samples)
            self._record(out, rows, self.pool.map([samples[j] for j in rows], self.timeout_s, interrupted))
        return out

    def _all_here(self, samples: list[RewardInput]) -> list[float] | None:
        """A trusted `reward.fn` on every sample at the cost of a bare loop, the values checked
        all at once (floats with a finite sum); None if a call raised or a value is not a finite
        float: `_score_here` then scores the batch again sample by sample (trusted scorers are
        pure), naming each failure."""
        fn, kwargs = self.fn, self.kwargs
        try:
            scores = [fn(sample, **kwargs) for sample in samples]
        except Exception:  # noqa: BLE001
            return None
        return scores if set(map(type, scores)) <= {float} and math.isfinite(sum(scores)) else None

    def _score_here(self, samples: list[RewardInput], rows, out: Scores) -> None:
        """Trusted scorers, in this process (no alarm: they are linear in the response)."""
        scores, fn, kwargs = out.scores, self.fn, self.kwargs
        for j in rows:
            sample = samples[j]
            try:
                raw = fn(sample, **kwargs) if fn is not None else REWARDS[sample.data_source](sample)
                scores[j] = raw if type(raw) is float and math.isfinite(raw) else checked(raw)
            except BadValue as e:
                self._record(out, [j], [(None, "bad_values", str(e))])
            except Exception:  # noqa: BLE001
                self._record(out, [j], [(None, "errors", traceback.format_exc(limit=-8))])

    def _record(self, out: Scores, rows: list[int], results: list[Result]) -> None:
        for j, (value, kind, message) in zip(rows, results):
            if kind == "ok":
                out.scores[j] = value
                continue
            out.counts["errors"] += 1  # every failure; the other kinds say which
            if kind != "errors":
                out.counts[kind] += 1
            out.error_rows.append(j)
            if out.first_error is None or j < min(out.error_rows[:-1], default=j + 1):
                out.first_error = f"sample {j}: {message}"

    def close(self) -> None:
        self.pool.close()


def interleaved(rows: list[int], samples: list[RewardInput]) -> list[int]:
    """`rows` with each prompt's samples spread apart (round robin over the prompts): the timeouts in a
    row that make a worker take its function to hang (`HANGS_AFTER`) are then of different prompts. A
    group's samples side by side made a reward slow on one prompt read as one that hangs, and the
    worker's later samples, of quick prompts, counted as timeouts unrun (the fifteenth catalogue's t30)."""
    groups: dict[str, list[int]] = {}
    for j in rows:
        groups.setdefault(samples[j].prompt, []).append(j)
    return [j for wave in itertools.zip_longest(*groups.values()) for j in wave if j is not None]
