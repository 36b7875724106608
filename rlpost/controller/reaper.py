"""A controller that is killed leaves no processes behind.

A run's controller starts processes it does not wait for: a local Ray's (GCS, raylet, and the
raylet's agents and workers), vLLM's engine processes under the rollout actors, reward workers.
When it ends in any way it can handle, it stops them (`ray.shutdown`). Killed with SIGKILL it runs
nothing more: Ray's raylet and GCS then end, but its dashboard and runtime-env agents stayed alive
(the fourteenth catalogue). `start_watcher` starts a small process of its own session that notes
every process under the controller every `EVERY` seconds and, once the controller is gone, stops
the ones it noted that are still alive (SIGTERM, then SIGKILL after `GRACE` seconds). A process
is known by its pid and start time, so a pid the system has given to another process since is left
alone. Linux only (it reads /proc); elsewhere nothing is started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EVERY = 2.0  # seconds between two looks at the controller's processes
GRACE = 3.0  # seconds between SIGTERM and SIGKILL


_WATCHERS: dict[int, subprocess.Popen] = {}  # one a process


def start_watcher(pid: int | None = None) -> subprocess.Popen | None:
    """The watcher of this process (or of `pid`), started once, or None where there is no /proc."""
    pid = pid or os.getpid()
    if not Path("/proc/self/stat").exists():
        return None
    if pid not in _WATCHERS or _WATCHERS[pid].poll() is not None:
        argv = [sys.executable, "-m", "rlpost.controller.reaper", str(pid)]
        # a session of its own: Ctrl-C on the terminal and a kill of the run's process group leave it to clean up
        _WATCHERS[pid] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    return _WATCHERS[pid]


def stat_of(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # (the name, in brackets, may hold spaces)
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every process under `root`."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := stat_of(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append((int(entry.name), stat[2]))
    found, todo = {}, [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            if pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def alive(pid: int, start: int) -> bool:
    stat = stat_of(pid)
    return stat is not None and stat[2] == start and stat[0] != "Z"


def stop(noted: dict[int, int], grace: float = GRACE) -> None:
    """SIGTERM to each noted process still alive, then SIGKILL to those still alive after `grace`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        living = [pid for pid, start in noted.items() if alive(pid, start)]
        for pid in living:
            try:
                os.kill(pid, sig)
            except OSError:  # ended meanwhile, or not ours to signal
                pass
        deadline = time.monotonic() + grace
        while sig == signal.SIGTERM and living and time.monotonic() < deadline:
            time.sleep(0.1)
            living = [pid for pid in living if alive(pid, noted[pid])]


def watch(root: int, every: float = EVERY, grace: float = GRACE) -> None:
    """Note `root`'s processes until it is gone, then stop them."""
    stat = stat_of(root)
    if stat is None:
        return
    start, noted = stat[2], {}
    while alive(root, start):
        noted.update(descendants(root))
        time.sleep(every)
    noted.pop(os.getpid(), None)  # (the watcher is one of them)
    stop(noted, grace)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (its own session already keeps the terminal's Ctrl-C away)
    watch(int(sys.argv[1]))
