"""Two file-system helpers of the checkpoints: a claim on a folder that one process writes into,
and the OSError (a full disk) behind an error that Ray and DCP wrapped."""

from __future__ import annotations

import os
import time
from pathlib import Path


def take_claim(claim: Path) -> None:
    """Make `claim` holding this process's id; one left by a process that is gone (an export killed
    by a signal: the eleventh catalogue's t99) is taken over."""
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pid = claim.read_text().strip()
            try:
                os.kill(int(pid), 0)
            except (ValueError, ProcessLookupError):  # empty (being written, or an old claim), or gone
                if pid or time.time() - claim.stat().st_mtime > 5:
                    claim.unlink(missing_ok=True)
                    continue
            except PermissionError:  # another user's live process
                pass
            raise
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return
    raise FileExistsError(claim)


def os_error_in(error: BaseException) -> OSError | None:
    """The first OSError with an errno (a full disk) behind `error`: through Ray's task errors and
    DCP's `CheckpointException` of each rank (a full disk read as a dead worker, its cause deep in
    Ray's dump: the eleventh catalogue's t73)."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno:
            return e
        failures = getattr(e, "failures", None)
        pairs = failures.values() if isinstance(failures, dict) else ()
        todo += [
            getattr(e, "cause", None),
            e.__cause__,
            e.__context__,
            *(p[0] if isinstance(p, tuple) else p for p in pairs),
        ]
    return None
