"""What stops a local Ray from starting, checked before it tries: its own errors come late, from its
processes, and name other causes (`check_ray_can_start`, called by `cluster.start_ray`)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from rlpost.config import ConfigError
from rlpost.limits import LimitError, check_limits


def ray_temp_root() -> str:
    """The folder under which Ray keeps its sessions (`ray/session_*`)."""
    import tempfile

    return os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or tempfile.gettempdir()


def check_ray_can_start() -> None:
    """What stops a local Ray from starting, said before it tries (its own errors come late, from
    its processes): a home folder it cannot write `~/.ray` into, warnings made errors, which end
    Ray's own processes as they start, and a temporary folder full, or too long for its sockets' paths."""
    home = Path.home()
    if not (home.is_dir() and os.access(home, os.W_OK)):
        raise ConfigError(f"HOME={str(home)!r} is not a folder this user can write: Ray writes ~/.ray; set HOME")
    filters = [f.strip().split(":") for f in os.environ.get("PYTHONWARNINGS", "").split(",")]
    if any(f[0] == "error" and not any(f[1:]) for f in filters):  # `error` for every warning of every module
        raise ConfigError(
            f"PYTHONWARNINGS={os.environ['PYTHONWARNINGS']!r} makes every warning an error, also in Ray's own "
            "processes, which then cannot start: unset it, or make errors of your modules' warnings only "
            "(error::Category:module)"
        )
    if sys.flags.optimize >= 2:  # (the nineteenth catalogue's t63: Ray failed after 46 s, said as a killed start)
        how = f"PYTHONOPTIMIZE={os.environ['PYTHONOPTIMIZE']!r}" if os.environ.get("PYTHONOPTIMIZE") else "python -OO"
        raise ConfigError(
            f"{how} strips docstrings, which Ray's own modules edit as they import (its dashboard then fails and "
            "Ray does not start): unset it, or use optimize level 1 (PYTHONOPTIMIZE=1, python -O)"
        )
    root = ray_temp_root()
    if not os.path.isabs(root):  # Ray's raylet stops at start, said as a killed or busy start (cat16's t128)
        name = "RAY_TMPDIR" if os.environ.get("RAY_TMPDIR") else "TMPDIR"
        raise ConfigError(
            f"{name}={root!r} is a relative path, which Ray cannot keep its sessions and sockets under (its raylet "
            f"stops as it starts): give an absolute folder, e.g. {name}={os.path.abspath(root)}"
        )
    if not os.access(root, os.W_OK | os.X_OK):  # Ray's raw PermissionError (the eleventh catalogue's t76)
        raise ConfigError(
            f"the temporary folder {root!r} (TMPDIR, or RAY_TMPDIR) cannot be written: Ray keeps its sessions "
            "there; set TMPDIR to a folder you can write, e.g. /tmp"
        )
    try:
        check_limits()  # (again: `rlpost train` checks them before torch loads, a library call here)
    except LimitError as e:
        raise ConfigError(str(e)) from None
    free = shutil.disk_usage(ray_dir if os.path.isdir(ray_dir := f"{root}/ray") else root).free  # (cat20's t59b)
    if free < RAY_TMP_NEED:  # a full disk: Ray's start timed out after 40 s, a raw traceback (cat12's t158)
        raise ConfigError(
            f"the temporary folder {root!r} (TMPDIR, or RAY_TMPDIR) has {free / 2**20:.1f} MiB free: Ray writes its "
            f"session's files there and cannot start; free space there, or set TMPDIR to a folder with room (at least "
            f"{RAY_TMP_NEED >> 20} MiB)"
        )
    socket_path = f"{root}/ray/session_2026-01-01_00-00-00_000000_{os.getpid()}/sockets/plasma_store"
    if len(socket_path.encode()) > SOCKET_PATH_MAX:
        raise ConfigError(
            f"the temporary folder {root!r} (TMPDIR) is too long for Ray: its sockets' paths would be "
            f"{len(socket_path.encode())} bytes, over the {SOCKET_PATH_MAX} a socket path may have; set TMPDIR "
            "(or RAY_TMPDIR) to a shorter folder, e.g. /tmp"
        )


SOCKET_PATH_MAX = 107  # bytes of an AF_UNIX socket path (Linux), which Ray checks as it starts
RAY_TMP_NEED = 64 << 20  # bytes free in Ray's temporary folder below which it is not started
