"""The console of `rlpost` as a command: text it cannot encode is written escaped (an ASCII
terminal, `PYTHONIOENCODING=ascii`), and a reader that goes away (`rlpost train ... | head`) does
not end the run: the stream is pointed at /dev/null and the run goes on, its log and metrics in
the run folder."""

from __future__ import annotations

import os
import sys

WORD = {"stdout": "output", "stderr": "error"}  # (the stream's name in a message: cat20's t122 read "errput")


class ConsoleError(Exception):
    """Standard output or error (`stream`) cannot be written (a full disk, an I/O error): `rlpost` says
    so on the other one and exits 1 (a raw OSError traceback from this file, the tenth catalogue's t59)."""

    def __init__(self, message: str, stream: str = "stdout"):
        super().__init__(message)
        self.stream = stream


class SteadyStream:
    """`stream`, whose broken pipe (the reader quit) sends what follows to /dev/null, said once."""

    def __init__(self, stream, name: str):
        self._stream, self._name, self.gone = stream, name, False

    def write(self, text: str) -> int:
        if self._stream is None:  # closed when rlpost started (`>&-`: the eleventh catalogue's t72)
            raise ConsoleError(f"cannot write to standard {WORD[self._name]} (it is closed)", self._name)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)
        except OSError as e:
            raise self._failed(e) from None

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()
        except OSError as e:
            raise self._failed(e) from None

    def _failed(self, error: OSError) -> ConsoleError:
        """What it could not write is dropped (and the flush at exit with it)."""
        self._to_devnull()
        return ConsoleError(f"cannot write to standard {WORD[self._name]} ({error.strerror or error})", self._name)

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())  # (what is still buffered goes there too, at exit as well)
        os.close(devnull)

    def _reader_gone(self) -> None:
        if self.gone:
            return
        self.gone = True
        self._to_devnull()
        other = sys.stderr if self._name == "stdout" else None
        if other is not None:
            other.write(f"\nrlpost: the reader of its {self._name} went away (a closed pipe): what it prints there is "
                        "dropped; a run goes on, its log and metrics in its folder\n")  # fmt: skip

    def __getattr__(self, name):
        if self._stream is None and name == "isatty":
            return lambda: False
        return getattr(self._stream, name)


def steady_console() -> None:
    """Make `sys.stdout` and `sys.stderr` steady (`SteadyStream`, escaped text): for the command only."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)  # (None: closed)
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
        setattr(sys, name, SteadyStream(stream, name))


def working_folder_gone() -> str | None:
    """What to say when the working directory no longer exists (a shell left in a deleted folder):
    torch's import then died in Intel oneMKL's "Cannot load libtorch_cpu.so" (the sixteenth
    catalogue's t129), which points at a broken install."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return "the working directory no longer exists (deleted or moved); cd to a folder that exists and run it again"
    return None


class Terminated(BaseException):
    """A SIGTERM during a command that cleans up what it made (`raise_terminated` raises it): an
    export's half-made --out (the twelfth catalogue's t99), `rlpost data`'s half-written file (t83)."""


def raise_terminated(signum, frame):
    raise Terminated
