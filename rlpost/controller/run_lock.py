"""`run.lock`: the pid and host of the run that holds a run folder (`rlpost.controller.run_dir`).
A second run is refused while the first lives; a dead run's lock (on this host) is taken over; a
lock that names no run is refused with what to delete; each step checks the lock is still this
run's (`keep_lock`), and `release_run_dir` gives it back when the run ends."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from rlpost.config import ConfigError

LOCK = "run.lock"


def take_lock(run_dir: Path, log) -> None:
    """Create `run.lock` for this process; refuse when a live run holds it. A lock whose process is
    gone (on this host) is taken over; one held on another host is refused: its owner cannot be
    checked from here."""
    path, me = run_dir / LOCK, {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    with _one_claim_at_a_time(run_dir):
        _take_lock(run_dir, path, me, log)


@contextmanager
def _one_claim_at_a_time(run_dir: Path):
    """The folder itself flock-ed while a run claims it, so that two runs that both find a dead
    run's lock cannot both take it over (each deleting the other's new lock). Where the file system
    has no flock, claims go on unguarded, as before."""
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # (closing it releases the flock)


def when(since) -> str:
    """A lock's `since` as a date; one written by hand (the twelfth catalogue's t18: "yesterday") as it is."""
    try:
        return datetime.fromtimestamp(float(since)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return repr(since)


def _take_lock(run_dir: Path, path: Path, me: dict, log) -> None:
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = read_lock(path)
            if holder.get("pid") == me["pid"] and holder.get("host") == me["host"]:
                return  # ours already (the run starting again after an actor died)
            if holder.get("host") == me["host"] and not _alive(holder.get("pid")):
                log(f"{path}: the run that held it (pid {holder.get('pid')}) is gone; taking the folder over")
                path.unlink(missing_ok=True)
                continue
            if "pid" not in holder:  # a folder, bytes that are no lock, or a lock still being written
                raise ConfigError(not_a_lock(run_dir, path))
            since = when(holder.get("since", 0))
            raise ConfigError(
                f"run.dir={str(run_dir)!r} is in use by another run (pid {holder.get('pid')} on host "
                f"{holder.get('host')}, since {since}); wait for it to end or choose another run.dir (if that run "
                f"is gone, delete {path})"
            )
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
        except OSError:  # a full disk: no empty lock left to refuse the next run (the twelfth catalogue's t16)
            path.unlink(missing_ok=True)
            raise
        return
    raise ConfigError(  # a dead run's lock came back as it was taken over: another claim, unguarded
        f"run.dir={str(run_dir)!r}: {path} came back each time it was taken over (another run claiming the folder "
        "at the same time?); try again, or choose another run.dir"
    )


def read_lock(path: Path) -> dict:
    """The lock's fields; {} for one being written or damaged, and no `pid` where it names no process
    a run can be (0, -1, true, 2**40: os.kill took them, or overflowed: cat21's t103-t106)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # being written, or damaged: not taken over
    if not isinstance(found, dict):
        return {}
    pid = found.get("pid")
    valid = isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= PID_MAX
    return found if valid else {k: v for k, v in found.items() if k != "pid"}


PID_MAX = 2**22  # Linux's largest pid_max


def not_a_lock(run_dir: Path, path: Path) -> str:
    """The refusal of a `run.lock` that names no run (cat20's t61, t62: it read "in use by pid None")."""
    what = "a folder" if path.is_dir() else "empty" if path.stat().st_size == 0 else "not a lock rlpost wrote"
    remove = "rm -r" if path.is_dir() else "rm"
    return (
        f"run.dir={str(run_dir)!r}: {path} is {what}, so no run that holds the folder can be named (a run starting "
        f"in it this moment writes one); if none is, delete it ({remove} {path}) and start again"
    )


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError):
        return True  # another user's process, or no pid to check: assume it runs
    return True


def keep_lock(run_dir: Path, step: int, log=print) -> None:
    """Each step: `run.lock` must still be this run's. Deleted by hand (its own message says to when
    a run is gone), it is taken again and said; taken by another run meanwhile, this one stops before
    it writes into a folder the other claims (the fourteenth catalogue's t29: a second run's
    run.overwrite=true deleted a live run's files, and both went on writing there)."""
    path = run_dir / LOCK
    holder = read_lock(path)
    if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        return
    if path.exists():
        from rlpost.controller.checkpoint import CheckpointError

        taker = (  # (not "pid None on host None": the review of cat20's t61, t62)
            f"another run (pid {holder['pid']} on host {holder.get('host')})"
            if "pid" in holder
            else "something that names no run (a folder, or bytes that are no lock)"
        )
        raise CheckpointError(
            f"{path} was taken by {taker} while this one "
            f"trained, after step {step} (its lock had been deleted): stopped here so that the two do not write "
            "into one folder; the other may have deleted this run's files (run.overwrite); go on in another run.dir"
        )
    log(f"{path} was deleted while the run trained (after step {step}): taken again; delete it only when no run is on")
    take_lock(run_dir, log)


def release_run_dir(run_dir: Path) -> None:
    """Delete `run.lock` if this process holds it."""
    path = run_dir / LOCK
    if read_lock(path).get("pid") == os.getpid():
        path.unlink(missing_ok=True)
