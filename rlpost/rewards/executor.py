"""Reward functions run like untrusted code: in a pool of worker processes, in parallel.

`RewardPool.score(samples)` scores the samples of trusted scorers (rlpost's own, see
`register_reward`) in this process, and splits the others into one contiguous chunk per worker. A worker
scores its chunk sample by sample, each under a `reward.timeout_s` alarm, inside an address-space
cap of `reward.memory_mb`; a sample that raises, returns something that is not a finite number,
or runs out of time scores `reward.error_score` and is counted by kind (`ERROR_KINDS`). The parent
waits for each chunk at most its samples' timeouts plus a grace: a worker that dies (a crash, the
memory cap, `os._exit`) or hangs where the alarm cannot reach (inside C code) is killed and
replaced, and the rest of its chunk is scored again one sample per message, so that the sample at
fault is found and its neighbours still count. Each error keeps its traceback.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import signal
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from rlpost.rewards.base import REWARDS, TRUSTED, RewardInput, get_reward_fn

ERROR_KINDS = ("errors", "timeouts", "bad_values", "crashes")  # `reward/<kind>` (errors: all of them)
GRACE_S = 2.0  # on top of the timeouts: process start, pickling, a busy machine


class SampleTimeout(BaseException):
    """Raised in a worker by the alarm: a BaseException, so `except Exception` in user code does
    not swallow it."""


@dataclass
class Scores:
    """What scoring a batch gave: a score per sample, how many failed of each kind, and the first
    failure with its traceback."""

    scores: list[float]
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    first_error: str | None = None
    error_rows: list[int] = field(default_factory=list)


# ------------------------------------------------------------------------------- in the worker
def _alarm(signum, frame):
    raise SampleTimeout()


def _score_one(fn, sample: RewardInput, kwargs: dict, timeout_s: float) -> tuple[float | None, str, str]:
    """(value, kind, message): kind is `ok`, `errors`, `timeouts` or `bad_values`."""
    scorer = fn if fn is not None else REWARDS.get(sample.data_source)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        if scorer is None:
            raise KeyError(f"no reward function registered for data_source {sample.data_source!r}; set reward.fn")
        raw = scorer(sample, **(kwargs if fn is not None else {}))
        signal.setitimer(signal.ITIMER_REAL, 0)
    except SampleTimeout:
        return None, "timeouts", f"timed out after reward.timeout_s={timeout_s}"
    except Exception:  # noqa: BLE001  (user code: any failure is counted, with its traceback)
        signal.setitimer(signal.ITIMER_REAL, 0)
        return None, "errors", traceback.format_exc(limit=-8)
    return _checked(raw)


def _checked(raw) -> tuple[float | None, str, str]:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        return None, "bad_values", f"returned {raw!r} ({type(raw).__name__}), not a finite number"
    return float(raw), "ok", ""


def _worker(conn, spec: str, kwargs: dict, timeout_s: float, memory_mb: int) -> None:
    # Ctrl-C and SIGTERM (sent to the whole process group by `timeout` or Slurm) are the
    # controller's to handle; it ends this process, and so does its exit (the pipe closes)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if memory_mb > 0:
        import resource

        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)

    fn = get_reward_fn(spec)
    while True:
        try:
            samples = conn.recv()
        except EOFError:
            return
        conn.send([_score_one(fn, s, kwargs, timeout_s) for s in samples])


# ------------------------------------------------------------------------------- in the parent
class RewardPool:
    """`workers` processes that score with `reward.fn` = `spec` (and `kwargs`). Samples whose
    scorer is trusted (`register_reward(..., trusted=True)`: rlpost's own) are scored in this
    process instead; the processes start when the first other sample comes."""

    def __init__(
        self,
        spec: str,
        kwargs: dict,
        workers: int,
        timeout_s: float,
        memory_mb: int,
        error_score: float,
    ):
        self.spec, self.kwargs, self.timeout_s, self.memory_mb = spec, dict(kwargs), timeout_s, memory_mb
        self.error_score = error_score
        self.fn = get_reward_fn(spec) if spec in TRUSTED else None  # None: by data_source, or in the pool
        self.ctx = mp.get_context("spawn")  # the controller has Ray's threads: never fork it
        self.procs: list = [None] * workers
        self.conns: list = [None] * workers

    def trusted(self, sample: RewardInput) -> bool:
        return self.spec in TRUSTED or (self.spec == "auto" and sample.data_source in TRUSTED)

    def _start(self, i: int) -> None:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(
            target=_worker, args=(child, self.spec, self.kwargs, self.timeout_s, self.memory_mb), daemon=True
        )
        proc.start()
        child.close()
        self.procs[i], self.conns[i] = proc, parent

    def _replace(self, i: int) -> None:
        self.procs[i].kill()
        self.procs[i].join()
        self.conns[i].close()
        self._start(i)

    def score(self, samples: list[RewardInput]) -> Scores:
        out = Scores(scores=[self.error_score] * len(samples))
        if self.spec in TRUSTED:
            rows = []
            self._score_here(samples, range(len(samples)), out)
        else:  # those for the pool
            rows = [j for j, sample in enumerate(samples) if not self.trusted(sample)]
            if len(rows) < len(samples):
                self._score_here(samples, sorted(set(range(len(samples))) - set(rows)), out)
        k = len(self.procs)
        chunks = [rows[i * len(rows) // k : (i + 1) * len(rows) // k] for i in range(k)]
        waiting = {}
        for i, chunk in enumerate(chunks):
            if chunk:
                self._send(i, [samples[j] for j in chunk])
                waiting[self.conns[i]] = (i, chunk, time.monotonic() + len(chunk) * self.timeout_s + GRACE_S)
        while waiting:
            deadline = min(d for *_, d in waiting.values())
            for conn in wait(list(waiting), timeout=max(0.0, deadline - time.monotonic())):
                i, chunk, _ = waiting.pop(conn)
                try:
                    results = conn.recv()
                except (EOFError, OSError):  # the worker died inside the chunk
                    self._replace(i)
                    self._one_by_one(i, samples, chunk, out)
                    continue
                self._record(out, chunk, results)
            for conn, (i, chunk, d) in list(waiting.items()):
                if time.monotonic() >= d and not conn.poll():  # hung where the alarm cannot reach
                    waiting.pop(conn)
                    self._replace(i)
                    self._one_by_one(i, samples, chunk, out)
        return out

    def _score_here(self, samples: list[RewardInput], rows, out: Scores) -> None:
        """Trusted scorers, in this process (no alarm: they are linear in the response)."""
        scores, fn, kwargs = out.scores, self.fn, self.kwargs
        for j in rows:
            sample = samples[j]
            try:
                raw = fn(sample, **kwargs) if fn is not None else REWARDS[sample.data_source](sample)
            except Exception:  # noqa: BLE001
                self._record(out, [j], [(None, "errors", traceback.format_exc(limit=-8))])
                continue
            if type(raw) is float and math.isfinite(raw):  # what the built-ins return
                scores[j] = raw
            else:
                self._record(out, [j], [_checked(raw)])

    def _send(self, i: int, samples: list[RewardInput]) -> None:
        """To worker `i`; one not started yet is started, one that died between batches replaced."""
        if self.procs[i] is None:
            self._start(i)
        try:
            self.conns[i].send(samples)
        except OSError:  # BrokenPipeError: the worker is gone
            self._replace(i)
            self.conns[i].send(samples)

    def _one_by_one(self, i: int, samples: list[RewardInput], chunk: list[int], out: Scores) -> None:
        """Score the rows `chunk` again on worker `i`, one per message: the sample that kills or
        hangs the worker is found (a crash, or a timeout) and the worker replaced again."""
        for j in chunk:
            self._send(i, [samples[j]])
            conn = self.conns[i]
            if wait([conn], timeout=self.timeout_s + GRACE_S):
                try:
                    self._record(out, [j], conn.recv())
                    continue
                except (EOFError, OSError):
                    self.procs[i].join(timeout=5)  # reaped: its exit code is known
                    kind, message = "crashes", f"the reward worker died (exit code {self.procs[i].exitcode})"
            else:
                kind, message = "timeouts", f"timed out after reward.timeout_s={self.timeout_s} (killed)"
            self._replace(i)
            self._record(out, [j], [(None, kind, message)])

    def _record(self, out: Scores, rows: list[int], results: list) -> None:
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
        for conn in self.conns:
            if conn is not None:
                conn.close()
        for proc in self.procs:
            if proc is not None:
                proc.kill()
                proc.join()
