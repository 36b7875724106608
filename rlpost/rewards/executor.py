"""Untrusted code runs in a pool of worker processes: reward functions, and the tools of
multi-turn environments (`rlpost.envs.tools`).

`WorkerPool` starts its processes when they are first needed. Each runs a function built in the
worker by `setup` (so nothing but a picklable reference crosses), item by item, each within a
timeout (one alarm per chunk, set again as items go by: `_alarm`), inside an address-space cap of
`memory_mb`; an item that raises, returns a value its caller refuses (`BadValue`) or runs out of
time comes back as `(None, kind, message)`, its kind one of `ERROR_KINDS`. The parent waits for
each item at most its timeout plus a grace: a worker that dies (a crash, the memory cap,
`os._exit`) or hangs where the alarm cannot reach (inside C code) is killed and replaced. `map`
spreads a batch in one contiguous chunk per worker (one message each way per worker), and when a
worker dies inside its chunk, scores the rest of it again one item per message, so that the item
at fault is found and its neighbours still count; `call` runs one item on the next idle worker,
from any number of threads (a tool call).

`rlpost.rewards.pool.RewardPool` scores a batch's samples with one (`pool._scorer`, `checked`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable

from rlpost.rewards.values import BadValue

ERROR_KINDS = ("errors", "timeouts", "bad_values", "crashes")  # `reward/<kind>` (errors: all of them)
GRACE_S = 2.0  # on top of the timeouts: pickling, a busy machine
START_S = 120.0  # for a worker to start and build its function (imports): not part of any timeout
Result = tuple[Any, str, str]  # (value, kind, message): kind `ok` or one of ERROR_KINDS


class ItemTimeout(BaseException):
    """Raised in a worker by the alarm: a BaseException, so `except Exception` in user code does
    not swallow it."""


class Interrupted(Exception):
    """`map` gave its batch up: the `interrupted()` it was given said so (a stop signal)."""


@dataclass
class Scores:
    """What scoring a batch gave: a score per sample, how many failed of each kind, and the first
    failure with its traceback."""

    scores: list[float]
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    first_error: str | None = None
    error_rows: list[int] = field(default_factory=list)


# ------------------------------------------------------------------------------- in the worker
_running = False  # an item is under way: only then may the alarm end it
_started = 0.0  # when it started (time.monotonic)
_timeout_s = 0.0  # the chunk's timeout per item
_memory_mb = 0  # the worker's address-space cap (0: none)
_fired = False  # the alarm ended the item under way (even if the function caught ItemTimeout and returned)
_touched = False  # reward.fn set SIGALRM's handler or the real-time timer itself during the item
_set_timer, _set_handler = signal.setitimer, signal.signal  # the pool's own: reward.fn's are watched
ALARM_TAKEN = (
    "{who} set SIGALRM's handler or timer itself (signal.alarm, setitimer or signal.signal), which replaces "
    "the pool's alarm: it ran on past the limit; leave timeouts to {key}"
)


def _watch_alarm_use() -> None:
    """In a worker, before reward.fn's module loads: its calls of `signal.alarm`, `setitimer(ITIMER_REAL)`
    and `signal.signal(SIGALRM, ...)` are noted, then made. They take the pool's alarm (the handler
    replaced, the timer cancelled by `alarm(0)`: the sixteenth catalogue's t32, where reward.timeout_s
    then cut nothing and slow samples scored as ordinary ones); after such an item it is set again."""

    def noted(real, takes_the_alarm):
        def call(*args, **kwargs):
            global _touched
            _touched = _touched or takes_the_alarm(*args)
            return real(*args, **kwargs)

        return call

    signal.alarm = noted(signal.alarm, lambda *_: True)
    signal.setitimer = noted(signal.setitimer, lambda which, *_: which == signal.ITIMER_REAL)
    signal.signal = noted(signal.signal, lambda signum, *_: signum == signal.SIGALRM)


def _alarm_back() -> bool:
    """Whether reward.fn took the alarm during the item; if it did, the pool's is set again."""
    global _touched
    touched, _touched = _touched, False
    if touched:
        _set_handler(signal.SIGALRM, _alarm)
        _set_timer(signal.ITIMER_REAL, _timeout_s)
    return touched


def _alarm(signum, frame):
    """The chunk's alarm. An item that has run `_timeout_s` when it rings is ended; otherwise it
    is set again for the moment the item under way (or the next one) would reach its timeout.
    Arming the alarm per item was two system calls per item, most of the pool's cost for a cheap
    function; a chunk of quick items now costs two in all, and a slow one an alarm per timeout."""
    global _fired
    now = time.monotonic()
    if _running and now - _started >= _timeout_s:
        _set_timer(signal.ITIMER_REAL, _timeout_s)  # for the items after this one
        _fired = True
        raise ItemTimeout()
    left = _started + _timeout_s - now if _running else _timeout_s
    _set_timer(signal.ITIMER_REAL, max(left, 1e-4))


def _call_one(fn: Callable, item, timeout_key: str) -> Result:
    """One item (the chunk's alarm armed, `_run_chunk`). An item the alarm ended is a timeout even
    where the function caught the alarm's exception (a bare `except:`) and returned (the fifteenth
    catalogue's t15: such samples were scored as ordinary results), and so is one that ran past the
    limit because reward.fn took the alarm itself (the sixteenth's t32)."""
    global _running, _started, _fired
    timed_out = f"timed out after {timeout_key}={_timeout_s:g}"
    _started, _fired = time.monotonic(), False
    try:  # (`_running` off first in each branch: the alarm raises only while it is on)
        _running = True
        value = fn(item)
        _running = False
        kind, said = "ok", ""
    except ItemTimeout:
        _running = False
        value, kind, said = None, "timeouts", timed_out
    except BadValue as e:
        _running = False
        value, kind, said = None, "bad_values", str(e)
    except BaseException:  # noqa: BLE001  (user code: any failure is counted, with its traceback; a sys.exit(),
        _running = False  # a KeyboardInterrupt or another BaseException it raises ends the call, not the worker: t14)
        said = traceback.format_exc(limit=-8).rstrip("\n")
        value, kind, said = None, "errors", said + hint(said, timeout_key)
    overran, touched = time.monotonic() - _started >= _timeout_s, _alarm_back()
    if kind == "timeouts" or not (_fired or overran):
        return value, kind, said
    if _fired:
        return None, "timeouts", timed_out + " (reward.fn caught the timeout)" * (kind == "ok")
    who = "reward.fn" if timeout_key.startswith("reward") else "the tool"  # (the pool runs tools too)
    why = ALARM_TAKEN.format(who=who, key=timeout_key) if touched else "it ran past the limit before the alarm"
    return None, "timeouts", f"{timed_out} ({why})"


DAEMONIC = (  # (a multiprocessing.Pool in a reward function: the twelfth catalogue's t114)
    " (the reward runs in a worker process that may not start processes of its own: score in threads, or let "
    "reward.num_workers set how many processes score at once)"
)
CAPPED = " (each worker process may use {key}={mb} MiB of address space: raise it, or 0 for no cap)"


def hint(said: str, timeout_key: str) -> str:
    """What rlpost's own worker adds to a failure it caused: a process started inside it, a MemoryError
    under its memory cap (the seventeenth catalogue's t44b), named by the pool's key."""
    if "daemonic processes are not allowed" in said:
        return DAEMONIC
    if said.splitlines()[-1].startswith("MemoryError") and _memory_mb > 0:
        return CAPPED.format(key=timeout_key.replace("timeout_s", "memory_mb"), mb=_memory_mb)
    return ""


HANGS_AFTER = 3  # timeouts in a row in one chunk: the function hangs; the rest of the chunk is not run


def _hangs(out: list[Result]) -> bool:
    """The last `HANGS_AFTER` results are all timeouts: the function hangs on everything."""
    return len(out) >= HANGS_AFTER and all(kind == "timeouts" for _, kind, _ in out[-HANGS_AFTER:])


def _run_chunk(fn: Callable, items: list, timeout_s: float, timeout_key: str, done=None) -> list[Result]:
    """Every item in turn, each within `timeout_s` (SIGALRM must be handled by `_alarm`), counted in
    `done` (shared with the parent, which so tells a worker its alarm cannot stop). After
    `HANGS_AFTER` timeouts in a row the function is taken to hang on everything: the items left
    count as timeouts without running, so a chunk costs at most that many timeouts, not one per
    item (a reward that hangs on every sample took `timeout_s` a sample, an hour a step)."""
    global _timeout_s
    _timeout_s = timeout_s
    _set_timer(signal.ITIMER_REAL, timeout_s)
    out: list[Result] = []
    try:
        for item in items:
            if _hangs(out):
                skipped = (
                    f"not run: the {HANGS_AFTER} items before it in this worker timed out ({timeout_key}={timeout_s:g})"
                )
                return out + [(None, "timeouts", skipped)] * (len(items) - len(out))
            out.append(_call_one(fn, item, timeout_key))
            if done is not None:
                done.value += 1
        return out
    finally:
        _set_timer(signal.ITIMER_REAL, 0)


def _worker(conn, setup: Callable[[], Callable], memory_mb: int, timeout_key: str, done=None) -> None:
    # Ctrl-C and SIGTERM (sent to the whole process group by `timeout` or Slurm) are the
    # parent's to handle; it ends this process, and so does its exit (the pipe closes)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # one item at a time: no thread pools (under the memory cap, OpenBLAS spins when it cannot
    # allocate the buffers of one thread per core)
    os.environ.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    global _memory_mb
    _memory_mb = memory_mb
    if memory_mb > 0:
        import resource

        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _set_handler(signal.SIGALRM, _alarm)
    _watch_alarm_use()
    try:
        fn = setup()
    except (Exception, SystemExit, KeyboardInterrupt):  # noqa: BLE001  (the user's module: the parent raises it)
        conn.send(traceback.format_exc(limit=-8))
        return
    conn.send("ready")
    while True:
        try:
            items, timeout_s = conn.recv()
            conn.send(_run_chunk(fn, items, timeout_s, timeout_key, done))
        except (EOFError, OSError):  # the parent closed the pipe (it stopped, or replaced this worker)
            return


# ------------------------------------------------------------------------------- in the parent
class WorkerStartError(RuntimeError):
    """A pool worker could not build its function: the setup's error, as the worker said it."""


class WorkerPool:
    """`workers` processes that run the function `setup()` builds in each (`setup` must pickle:
    a module-level function, or a `functools.partial` of one). Messages call them `name` workers and
    name `timeout_key`. Use a pool either with `map` from one thread or with `call` from many."""

    report_s = 50.0  # a `map` still waiting this long (and every as long again after) says so (`log`)

    def __init__(
        self, setup: Callable[[], Callable], workers: int, memory_mb: int, name: str, timeout_key: str, log=print
    ):
        self.setup, self.memory_mb, self.name, self.timeout_key = setup, memory_mb, name, timeout_key
        self.log = log
        self.ctx = mp.get_context("spawn")  # the parent may have Ray's or torch's threads: never fork it
        self.procs: list = [None] * workers
        self.conns: list = [None] * workers
        self.done: list = [None] * workers  # items each worker has finished of its chunk (shared)
        self.ready = [False] * workers
        self.idle: queue.SimpleQueue[int] = queue.SimpleQueue()  # for `call`
        for i in range(workers):
            self.idle.put(i)

    def _start(self, i: int) -> None:
        parent, child = self.ctx.Pipe()
        self.done[i] = self.ctx.Value("i", 0, lock=False)
        args = (child, self.setup, self.memory_mb, self.timeout_key, self.done[i])
        proc = self.ctx.Process(target=_worker, args=args, daemon=True)
        proc.start()
        child.close()
        self.procs[i], self.conns[i], self.ready[i] = proc, parent, False

    def wait_ready(self, i: int) -> None:
        """Until worker `i` has built its function: its start is not counted in any timeout."""
        if self.procs[i] is None:
            self._start(i)
        if self.ready[i]:
            return
        message = f"it did not start within {START_S:g} s"
        if wait([self.conns[i]], timeout=START_S):
            try:
                message = self.conns[i].recv()
            except (EOFError, OSError):
                self.procs[i].join(timeout=5)
                message = f"it died as it started (exit code {self.procs[i].exitcode})"
        if message != "ready":
            raise WorkerStartError(f"a {self.name} worker could not start: {message}")
        self.ready[i] = True

    def _replace(self, i: int) -> None:
        self.procs[i].kill()
        self.procs[i].join()
        self.conns[i].close()
        self._start(i)

    def _send(self, i: int, items: list, timeout_s: float) -> None:
        """To worker `i` once it is ready; one not started yet is started, one that died in between
        replaced."""
        self.wait_ready(i)
        self.done[i].value = 0
        try:
            self.conns[i].send((items, timeout_s))
        except OSError:  # BrokenPipeError: the worker is gone
            self._replace(i)
            self.wait_ready(i)
            self.conns[i].send((items, timeout_s))

    def _one(self, i: int, item, timeout_s: float) -> Result:
        """`item` alone on worker `i`; the worker is replaced if it dies or hangs on it."""
        self._send(i, [item], timeout_s)
        conn = self.conns[i]
        if wait([conn], timeout=timeout_s + GRACE_S):
            try:
                return conn.recv()[0]
            except (EOFError, OSError):
                self.procs[i].join(timeout=5)  # reaped: its exit code is known
                result = None, "crashes", f"the {self.name} worker died (exit code {self.procs[i].exitcode})"
        else:
            result = None, "timeouts", f"timed out after {self.timeout_key}={timeout_s:g} (killed)"
        self._replace(i)
        return result

    def call(self, item, timeout_s: float) -> Result:
        """`item` on the next idle worker (blocks while all are busy); safe from many threads."""
        i = self.idle.get()
        try:
            return self._one(i, item, timeout_s)
        finally:
            self.idle.put(i)

    def map(self, items: list, timeout_s: float, interrupted: Callable[[], bool] | None = None) -> list[Result]:
        """Every item, in one contiguous chunk per worker; results in the items' order. Where
        `interrupted()` turns true while it waits (checked each second), the workers still at
        their share are replaced and `Interrupted` is raised."""
        results: list = [None] * len(items)
        k = len(self.procs)
        chunks = [range(i * len(items) // k, (i + 1) * len(items) // k) for i in range(k)]
        for i, chunk in enumerate(chunks):
            if chunk and self.procs[i] is None:
                self._start(i)  # all at once: they start in parallel
        waiting, moved = {}, {}  # conn -> (worker, its chunk); worker -> (items done, when that last changed)
        for i, chunk in enumerate(chunks):
            if chunk:
                self._send(i, [items[j] for j in chunk], timeout_s)
                waiting[self.conns[i]], moved[i] = (i, chunk), (0, time.monotonic())
        start = time.monotonic()
        report = start + self.report_s
        while waiting:
            if interrupted is not None and interrupted():
                for i, _ in waiting.values():
                    self._replace(i)
                raise Interrupted(f"{self.name}: {len(waiting)} of {k} workers stopped at their share")
            if time.monotonic() >= report:
                self._say_waiting(waiting, len(items), time.monotonic() - start, timeout_s)
                report += self.report_s
            for conn in wait(list(waiting), timeout=max(0.0, min(report, time.monotonic() + 1.0) - time.monotonic())):
                i, chunk = waiting.pop(conn)
                try:
                    results[chunk.start : chunk.stop] = conn.recv()
                except (EOFError, OSError):  # the worker died inside the chunk: find the culprit
                    self._replace(i)
                    results[chunk.start : chunk.stop] = self._again(i, items, chunk, timeout_s)
            for conn, (i, chunk) in list(waiting.items()):
                count = self.done[i].value
                if count != moved[i][0]:
                    moved[i] = count, time.monotonic()
                elif time.monotonic() - moved[i][1] > timeout_s + GRACE_S and not conn.poll():  # no alarm reached it
                    waiting.pop(conn)
                    self.log(  # (a stopped process, or one stuck in native code: cat11's t31, cat18's t45)
                        f"{self.name}: a worker finished no item in {timeout_s + GRACE_S:g} s ({self.timeout_key}="
                        f"{timeout_s:g} each; {count} of its {len(chunk)} done), where its own alarm could not stop "
                        "it (a stopped process, one stuck in native code, or reward.fn cancelled the alarm): "
                        "replaced, and its items scored again one at a time"
                    )
                    self._replace(i)
                    results[chunk.start : chunk.stop] = self._again(i, items, chunk, timeout_s)
        return results

    def _say_waiting(self, waiting: dict, total: int, took: float, timeout_s: float) -> None:
        left = sum(len(chunk) - self.done[i].value for i, chunk in waiting.values())
        self.log(
            f"{self.name}: {len(waiting)} of {len(self.procs)} workers still scoring their share ({left} of {total} "
            f"items left) after {took:.0f} s ({self.timeout_key}={timeout_s:g} each; a function that hangs costs "
            f"{HANGS_AFTER} of them a worker)"
        )

    def _again(self, i: int, items: list, chunk: range, timeout_s: float) -> list[Result]:
        """The items of `chunk` one at a time on worker `i` (replaced where it dies or hangs), after
        the chunk failed; after `HANGS_AFTER` timeouts in a row the rest count as timeouts unrun, so
        a function stuck where no alarm reaches costs a few timeouts, not one per item."""
        out: list[Result] = []
        for j in chunk:
            if _hangs(out):
                unrun = f"not run: the {HANGS_AFTER} items before it timed out ({self.timeout_key}={timeout_s:g})"
                return out + [(None, "timeouts", unrun)] * (len(chunk) - len(out))
            out.append(self._one(i, items[j], timeout_s))
        return out

    def close(self) -> None:
        for conn in self.conns:
            if conn is not None:
                conn.close()
        for proc in self.procs:
            if proc is not None:
                proc.kill()
                proc.join()
