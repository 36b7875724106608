"""The process limits (`ulimit`) that Ray and a run need, checked before torch loads (`rlpost train`)
and before a local Ray starts (`controller.ray_checks`): a soft limit below what a run needs is
raised as far as its hard limit allows; one that cannot be is refused, naming its `ulimit`."""

from __future__ import annotations

import contextlib
import resource


class LimitError(ValueError):
    """A process limit below what Ray and a run need, which this process cannot raise."""


LIMITS = {  # (what, its ulimit, the least Ray and a run need, the soft limit it is raised to where lower)
    resource.RLIMIT_NOFILE: ("open files", "ulimit -n", 1024, 65536),  # (cat20's t55: 64, the raylet died; 65536
    # as launchers raise it)
    resource.RLIMIT_FSIZE: ("file size", "ulimit -f", 1 << 30, 1 << 30),  # (t56: 200 kB, Ray did not start)
    resource.RLIMIT_AS: ("address space", "ulimit -v", 64 << 30, 64 << 30),  # (t57: 3 GB; Ray's object store alone
    # mapped 7.4 GB on a 24 GB machine: 64 GiB leaves torch and vLLM room, a margin not measured)
    resource.RLIMIT_DATA: ("data segment", "ulimit -d", 64 << 30, 64 << 30),  # (cat21's t41: torch's import failed)
    resource.RLIMIT_STACK: ("stack", "ulimit -s", 8 << 20, 8 << 20),  # (cat21's t47: Ray's workers crashed, no word)
}


def check_limits() -> None:
    """Each soft limit of `LIMITS` below what it is raised to is raised, as far as its hard limit allows
    (a soft limit above it is left as the user set it); one still below what Ray and a run need is
    refused, naming its `ulimit`."""
    inf = resource.RLIM_INFINITY
    for which, (what, flag, need, want) in LIMITS.items():
        soft, hard = resource.getrlimit(which)
        goal = want if hard == inf else min(hard, want)
        if soft != inf and soft < goal:
            with contextlib.suppress(ValueError, OSError):  # (a system that does not let it be raised: refused below)
                resource.setrlimit(which, (goal, hard))
                soft = goal
        if soft != inf and soft < need:
            unit, more = (
                (1, "") if which == resource.RLIMIT_NOFILE else (1024, " (KiB), or unlimited")
            )  # (bash counts KiB)
            raise LimitError(
                f"this process's {what} limit ({flag}) is {soft // unit}, and its hard limit "
                f"{'unlimited' if hard == inf else hard // unit}: Ray's processes and a run need at least "
                f"{need // unit}; raise it ({flag} {need // unit}{more})"
            )
