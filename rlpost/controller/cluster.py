"""Ray at the edge: starting Ray and calling groups of actors (placing them: placement.py)."""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import ray

from rlpost.config import ConfigError, TrainConfig
from rlpost.controller.ray_checks import check_ray_can_start, ray_temp_root
from rlpost.controller.reaper import start_watcher
from rlpost.data.batch import Batch

if TYPE_CHECKING:
    from rlpost.controller.placement import Placement

# the libraries' own output that a run does not need to show (`logger.verbose=true` keeps it):
# model-loading progress bars (transformers, huggingface_hub) and vLLM's info lines
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "VLLM_LOGGING_LEVEL": "WARNING"}


def quiet_libraries(verbose: bool) -> None:
    """In this process and (through `actor_env`) the actors: the libraries' progress bars and info
    lines off, unless `verbose` or the user set the variable; warnings and errors stay."""
    if verbose:
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    import transformers

    transformers.utils.logging.disable_progress_bar()  # read at import: this process imported it


def actor_env(cfg: TrainConfig) -> dict[str, str]:
    threads = str(cfg.cluster.num_threads)
    env = {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TOKENIZERS_PARALLELISM": "false",
    }
    if not cfg.logger.verbose:  # the libraries' deprecation notices (logged warnings still show) and
        env["PYTHONWARNINGS"] = "ignore"  # progress bars (vLLM's CUDA-graph capture, weight loading):
        env["TQDM_DISABLE"] = "1"  # an actor has no bar of its own to show
    # the driver's NCCL and vLLM settings (e.g. NCCL_NVLS_ENABLE=0: NVLink multicast off, see
    # docs/multinode.md) and import path reach every actor
    env.update(
        {
            k: v
            for k, v in os.environ.items()
            if k.startswith(("NCCL_", "VLLM_")) or k in ("HF_HUB_OFFLINE", "PYTHONPATH", *QUIET_ENV)
        }
    )
    return env


def plain_text() -> bool:
    """Whether the console takes no colour: NO_COLOR set, TERM=dumb, or output to a file or pipe."""
    return bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb" or not sys.stdout.isatty()


def start_ray(cfg: TrainConfig, log=print) -> None:
    if ray.is_initialized():
        return
    start_watcher()  # if this process is killed, what it started is stopped (controller/reaper.py)
    if plain_text():  # the actors' lines without Ray's colour codes (the ninth catalogue's n38)
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    level = logging.INFO if cfg.logger.verbose else logging.WARNING  # "Started a local Ray instance"
    if not cfg.logger.verbose:  # a notice on each start that a local cluster uses a token
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if cfg.cluster.address:
        check_cluster_answers(cfg.cluster.address)
        try:
            init_ray(address=cfg.cluster.address, runtime_env={"env_vars": actor_env(cfg)}, logging_level=level)
        except ConnectionError as e:  # `auto` with no cluster: Ray's advice names its own flag, not the key
            raise ConfigError(
                f"cluster.address={cfg.cluster.address!r}: no running Ray cluster found ({str(e).split('.')[0]}); "
                "start one with `ray start --head`, give its host:port, or leave cluster.address empty for a local Ray"
            ) from None
        return
    workers_at_normal_priority()
    if os.environ.get("RAY_ADDRESS"):  # Ray would join that cluster, and refuse the resources given here
        log(f"RAY_ADDRESS={os.environ['RAY_ADDRESS']} is set, cluster.address is not: starting a local Ray (to "
            "train on that cluster, set cluster.address)")  # fmt: skip
    check_ray_can_start()
    # logical CPUs: enough for every bundle even on a 2-core machine (actors take turns)
    needed = cfg.trainer.world_size + cfg.rollout.num_workers
    init_ray(
        address="local",  # a new local instance, whatever RAY_ADDRESS says
        num_cpus=max(os.cpu_count() or 1, needed),
        num_gpus=visible_gpus() if cfg.trainer.device == "cuda" else None,
        include_dashboard=False,
        runtime_env={"env_vars": actor_env(cfg)},
        log_to_driver=True,  # the actors' warnings and errors, with their name and pid
        logging_level=level,
    )


def init_ray(**kwargs) -> None:
    """`ray.init`, whose own SIGTERM handler (in place while it starts, until rlpost's is installed
    again) ends the process with `sys.exit(15)` and no word: that is a stop on SIGTERM, said as one,
    with what Ray had started shut down."""
    import signal

    from rlpost.controller.signals import Stopped

    started = datetime.now()
    try:
        ray.init(**kwargs)
    except SystemExit as e:
        if e.code != signal.SIGTERM:
            raise
        ray.shutdown()
        print("\nrlpost: SIGTERM while Ray was starting: stopping now, before any actor started", file=sys.stderr)
        raise Stopped(signal.SIGTERM) from None
    except Exception as e:  # a local Ray whose processes did not come up (its raylet killed: cat11's t102)
        if kwargs.get("address") != "local":
            raise
        ray.shutdown()
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        logs = f"{ray_temp_root()}/ray/session_latest/logs"
        said = last_ray_error(logs, started)  # (cat20's t57: an address-space limit was said as a killed start)
        raise RayDidNotStart(
            f"Ray's local instance did not start ({why}). Its processes' logs (raylet.out, gcs_server.out) are in "
            f"{logs}.{f' Its last error: {said}.' if said else ''} Else a process of it ended as it started (killed "
            "from outside, or by the out-of-memory killer) or the machine was too busy to start it in time: start "
            "the run again"
        ) from None


def last_ray_error(logs: str, since: datetime) -> str | None:
    """The last error line (glog's `E` or `F`) written since `since` to Ray's raylet or GCS log in
    `logs`, without its prefix (`session_latest` may be another run's that started meanwhile)."""
    found = None
    for name in ("gcs_server.out", "raylet.out"):
        try:
            lines = Path(logs, name).read_text(errors="replace").splitlines()[-500:]
        except OSError:
            continue
        errors = [m.group(2) for m in map(RAY_ERROR.match, lines) if m and m.group(1) >= f"{since:%Y-%m-%d %H:%M:%S}"]
        found = f"{name}: {errors[-1][:240]}" if errors else found
    return found


# a glog line: [2026-11-29 11:10:06,227 E 897 897] file.cc:1: what (its time and what)
RAY_ERROR = re.compile(r"^\[([\d-]+ [\d:]+),\d+ [EF] \d+ \d+\] (.*\S)")


class RayDidNotStart(RuntimeError):
    """The local Ray that a run starts did not come up: what Ray said, and where its logs are."""


class ActorsDidNotStart(RayDidNotStart):
    """An actor's start raised (an import that fails: a vLLM built for another device): said in a line."""


def visible_gpus() -> int:
    """The GPUs this process sees (CUDA_VISIBLE_DEVICES honoured), counted by CUDA itself: a local
    Ray told this number does not depend on its own NVML probe, which counts 0 when it fails to
    start (seen with four runs starting at once on one machine: a placement that never came)."""
    import torch

    return torch.cuda.device_count()


def check_cluster_answers(address: str, timeout_s: float = 10.0) -> None:
    """`cluster.address=host:port` (or `ray://host:port`) must answer a TCP connection within
    `timeout_s`: Ray's own client retries an address where nothing listens for minutes, deaf to
    SIGTERM. (`auto` is Ray's to find.)"""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"cluster.address={address!r}: want host:port (the head node's GCS, e.g. 10.0.0.1:6379) or auto"
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(
            f"cluster.address={address!r}: no Ray cluster answers there ({e.strerror or type(e).__name__}); "
            "start one with `ray start --head` on that node, or fix the address"
        ) from None


def workers_at_normal_priority() -> None:
    """For a Ray started by this process: Ray starts its workers at nice 15, for tasks that yield
    to the rest of a node; here the actors are the work, and at 15 Ray's own daemons preempt them
    (the trainer's update took 5-8% longer in an actor at 15 than in one at 0, taking turns:
    benchmarks/bench_overhead.py). `RAY_worker_niceness=0 ray start ...` does the same on a cluster."""
    os.environ.setdefault("RAY_worker_niceness", "0")


def local_ray_died() -> bool:
    """Whether a process of the Ray this driver started (GCS, raylet, ...) has died: a signal sent
    to the whole process group (`timeout`, Slurm) reaches them too. Then no call to Ray returns
    for a minute (its client retries the GCS), so the driver must not make any."""
    node = ray._private.worker._global_node if ray.is_initialized() else None
    return bool(node is not None and node.head and node.dead_processes())


class Stall(RuntimeError):
    """An actor call ran past `cluster.stall_timeout_s`: the error names the role, rank and call."""


@dataclass(frozen=True)
class Deadlines:
    """How long the controller waits on actor calls: every `warn_s` it says what it still waits
    on; past `timeout_s` it stops (`cluster.stall_warn_s`, `cluster.stall_timeout_s`)."""

    warn_s: float = math.inf
    timeout_s: float = math.inf
    log: Callable[[str], None] = print
    poll: Callable[[], None] | None = None  # called each second while waiting (may raise: a signal's stop)

    @staticmethod
    def of(cfg: TrainConfig, log=print, poll=None) -> "Deadlines":
        return Deadlines(cfg.cluster.stall_warn_s, cfg.cluster.stall_timeout_s, log, poll)


def wait_first(refs: list, start: float, labels: dict | None = None, deadlines: Deadlines = Deadlines()):
    """The first of `refs` to finish (not fetched). Counted from `start`, every `deadlines.warn_s`
    the calls still running are named (`labels`: ref -> "role rank r: method"); past
    `deadlines.timeout_s` a `Stall` names them."""
    labels = labels or {}
    while True:
        now = time.monotonic()
        warn = start + (math.floor((now - start) / deadlines.warn_s) + 1) * deadlines.warn_s
        until = min(warn, start + deadlines.timeout_s, now + 1.0 if deadlines.poll else math.inf) - now
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=None if until == math.inf else max(0.0, until))
        if ready:
            return ready[0]
        if deadlines.poll is not None:
            deadlines.poll()
        waited = time.monotonic() - start
        what = "; ".join(labels.get(r, "a task") for r in refs)
        if waited >= deadlines.timeout_s:
            raise Stall(
                f"waited {waited:.0f} s for {what} (cluster.stall_timeout_s={deadlines.timeout_s:g}): "
                "the call is stuck or slower than the limit allows (if only slow, raise cluster.stall_timeout_s)"
            )
        if time.monotonic() >= warn:
            deadlines.log(f"still waiting after {waited:.0f} s for {what}")


def get_all(
    refs: list, first: list = (), grace_s: float = 10.0, labels: dict | None = None, deadlines: Deadlines = Deadlines()
) -> list:
    """`ray.get(refs)`, which raises as soon as one task fails: a rank that failed inside a
    collective leaves its peers waiting for it until the process group times out. When the failure
    is not one of `first` (tasks whose errors say more: a rollout's names the tensor at fault),
    those get `grace_s` to fail too, and their error is raised instead. Waits with `deadlines`
    (`wait_first`)."""
    start, pending = time.monotonic(), list(refs)
    while pending:
        ready = wait_first(pending, start, labels, deadlines)
        pending.remove(ready)
        try:
            ray.get(ready)
        except ray.exceptions.RayError as e:
            _prefer(first, grace_s)
            _fetch_failures(pending)
            if isinstance(e, ray.exceptions.ActorDiedError) and "creation task" in str(e):  # (cat15's t53)
                last = [line for line in str(e).splitlines() if line.strip()][-1].strip()[:300]
                who = (labels or {}).get(ready, "an actor").split(":")[0]
                raise ActorsDidNotStart(
                    f"{who} died as it started: {last} (`rlpost doctor` lists what imports)"
                ) from None
            raise
    return ray.get(list(refs))


def _fetch_failures(refs: list, wait_s: float = 2.0) -> None:
    """Fetch, and drop, the errors of the calls beside a failed one that end within `wait_s` (a
    collective's peers fail with it): Ray prints an error nobody fetched as an "Unhandled error"
    traceback of its own (67 lines after a full disk's one line: the twelfth catalogue's t73)."""
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=wait_s) if refs else ([], [])
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayError:
            pass


def _prefer(first: list, grace_s: float) -> None:
    """Raise the error of one of `first` that fails within `grace_s`, if any does."""
    deadline, pending = time.monotonic() + grace_s, list(first)
    while pending:  # each as it ends: one that failed first is raised at once
        ready, pending = ray.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            return
        ray.get(ready)


class WorkerGroup:
    """N actors of one role; `call` runs a method on all of them, `call_sharded` splits a batch
    by data-parallel rank first. Both gather the results in rank order. `groups`: name -> (calls at
    once, methods): those methods run on threads of their own in each actor (a Ray concurrency
    group), beside the others, which run one at a time in the order they were called."""

    def __init__(
        self,
        cls,
        cfg: TrainConfig,
        placement: Placement,
        bundles: list[int],
        role: str,
        args_for_rank,
        log=print,
        groups: dict[str, tuple[int, tuple[str, ...]]] | None = None,
        poll=None,
    ):
        groups = groups or {}
        sizes = {name: size for name, (size, _) in groups.items()}
        remote_cls = ray.remote(concurrency_groups=sizes)(cls) if groups else ray.remote(cls)
        self.group_of = {method: name for name, (_, methods) in groups.items() for method in methods}
        self.role, self.deadlines = role, Deadlines.of(cfg, log, poll)
        self.labels: dict = {}  # the calls under way: ref -> "role rank r: method"
        self.workers = [
            remote_cls.options(**placement.options(cfg, b, f"{role}-{rank}-{os.getpid()}", role)).remote(
                *args_for_rank(rank)
            )
            for rank, b in enumerate(bundles)
        ]

    def __len__(self) -> int:
        return len(self.workers)

    def submit(self, rank: int, method: str, *args, **kwargs):
        """Start `method` on the actor of `rank`; returns its future (wait on it with `get`)."""
        call = getattr(self.workers[rank], method)
        if method in self.group_of:
            call = call.options(concurrency_group=self.group_of[method])
        ref = call.remote(*args, **kwargs)
        self.labels[ref] = f"{self.role} rank {rank}: {method}"
        return ref

    def get(self, refs: list, first: list = (), others: WorkerGroup | None = None, done: bool = True) -> list:
        """The results of calls started by `submit` (of this group, and of `others`), with this
        group's deadlines (`get_all`); `done=False`: they will be waited on again."""
        groups = [g for g in (self, others) if g is not None]
        labels = {k: v for g in groups for k, v in g.labels.items()}
        try:
            return get_all(refs, first, labels=labels, deadlines=self.deadlines)
        finally:
            for group in groups if done else ():
                for ref in refs:
                    group.labels.pop(ref, None)

    def call_async(self, method: str, *args, **kwargs) -> list:
        return [self.submit(rank, method, *args, **kwargs) for rank in range(len(self.workers))]

    def call(self, method: str, *args, **kwargs) -> list:
        return self.get(self.call_async(method, *args, **kwargs))

    def call_sharded(self, method: str, batch: Batch | list[Batch], *args, **kwargs) -> list:
        """`batch` split into equal contiguous shards by rank, or a list of one shard per rank."""
        shards = batch.chunk(len(self.workers)) if isinstance(batch, Batch) else batch
        if len(shards) != len(self.workers):
            raise ValueError(f"{len(shards)} shards for {len(self.workers)} {self.role} workers")
        return self.get([self.submit(rank, method, s, *args, **kwargs) for rank, s in enumerate(shards)])

    def kill(self) -> None:
        for w in self.workers:
            ray.kill(w)
