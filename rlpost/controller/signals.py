"""Signals: the first SIGTERM, SIGINT, SIGHUP (the terminal or ssh session closed; not under
`nohup`, which ignores it), SIGUSR1 or SIGUSR2 (Slurm's `--signal=USR1@SECONDS`, the warning before a
job's time runs out; each left alone where it was ignored) stops the run after the step under way (with a checkpoint,
`trainer.save_on_signal`), a second one at once; one before or while the workers start (a model being
built, the data being read, actors starting) stops it at once."""

from __future__ import annotations

import os
import signal
import sys
import threading

STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)  # (cat20's t146: USR1 killed)


class Stopped(Exception):
    """The run stopped cleanly on a signal (`STOPS`); the exit code is 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


class SecondSignal(KeyboardInterrupt):
    """A second signal: the run stops at once; `rlpost` exits 128 + `signum` (it exited 130, SIGINT's
    code, for a second SIGTERM too: the eleventh catalogue's t103)."""

    def __init__(self, signum: int):
        super().__init__(f"second {signal.Signals(signum).name}: stopping at once")
        self.signum = signum


class WorkersGone(RuntimeError):
    """A stop signal reached Ray's own processes too (sent to the whole process group: `timeout`,
    Slurm's `scancel`): the step under way cannot finish, and no call to Ray returns any more."""


class StopSignals:
    """While it is installed, the first signal of `STOPS` is only noted (`signal`: the loop stops
    after the step under way); a second one raises KeyboardInterrupt at once."""

    def __init__(self):
        self.signal: int | None = None
        self.before_start = True  # until the workers start there is no step to finish: a signal stops at once
        self.starting = False  # the workers starting: a signal stops the start, and what started is shut down
        self.finishing = False  # the steps done: the report and the shutdown finish, whatever comes
        self.ray_gone = lambda: False  # whether Ray's own processes died (`cluster.local_ray_died`, set by `train`)
        self.previous = {s: signal.getsignal(s) for s in STOPS}
        for s in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):  # ignored (`nohup`: the user asked to outlive
            if self.previous[s] is signal.SIG_IGN:  # the terminal): left so
                del self.previous[s]
        self.install()

    def install(self) -> None:
        """(Again after Ray starts: its core installs a SIGTERM handler of its own that aborts.)"""
        for s in self.previous:
            signal.signal(s, self._note)

    def _note(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None and not self.finishing:
            if in_finalizer(frame):  # raised in a __del__, it is printed and dropped (the twelfth catalogue's t01):
                threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()  # sent again, to land outside it
                return
            raise SecondSignal(signum)
        self.signal = self.signal or signum
        if self.before_start:  # building a model, reading the data: nothing to save
            sys.stderr.write(f"\nrlpost: {name} before the run started: stopping now\n")
            raise Stopped(signum)
        if self.starting:  # the start's waits stop at their next look (`check`): raised here, inside Ray's wait,
            # it became a SystemError traceback
            sys.stderr.write(f"\nrlpost: {name} while the workers started: stopping now (what started is shut down)\n")
            return
        if self.finishing:  # (a second one cut the shutdown short: Ray's agents outlived the run, cat12's t187)
            sys.stderr.write(f"\nrlpost: {name} as the run ends: finishing its summary and shutdown\n")
            return
        sys.stderr.write(f"\nrlpost: {name}: stopping after the step under way; send it again to stop at once\n")

    def check(self) -> None:
        """Called each second by every wait on the workers. `Stopped` for a signal that came while the
        workers started: they waited for the whole start, which may never come (workers Ray's memory
        monitor killed again and again: the tenth catalogue's t57). `WorkersGone` for one that took
        Ray's processes too: the step never ends, and Ray's client ended the program a minute later
        with its own message (the nineteenth catalogue's t58, t60)."""
        if self.signal is None or self.finishing:
            return
        if self.starting:
            raise Stopped(self.signal)
        if self.ray_gone():
            raise WorkersGone(f"{signal.Signals(self.signal).name} reached Ray's own processes too")

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def in_finalizer(frame) -> bool:
    """Whether `frame` runs inside an object's `__del__`, which drops what is raised in it."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False
