"""The sandboxed Python tool: the model's code runs in a fresh interpreter, in a temporary
working folder that is deleted afterwards, with none of the host's environment variables, under
limits of CPU time, memory (address space), processes, file size and wall-clock time, and with an
audit hook (installed before the code runs; code cannot remove one) that refuses to open a file
outside the folder (reads of Python's own library excepted), to start a process, to fork, to open
a socket or to load native code with ctypes. What the code prints is the result (at most
`max_output` characters); an error is the last line of its traceback, or the limit it hit.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass

from rlpost.envs.base import ENVS, EpisodeRow
from rlpost.envs.tools import ToolEnv, tool

# Runs first in the child: `sys.argv[1]` is the working folder, the code comes on stdin.
GUARD = r"""
import os, sys
root = os.path.realpath(sys.argv[1])
readable = tuple(os.path.realpath(p) for p in sys.argv[2:])
BLOCKED = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
           "subprocess.Popen", "socket.__new__", "socket.connect", "socket.bind", "ctypes.dlopen",
           "ctypes.dlsym", "os.kill", "os.killpg", "signal.pthread_kill")
PATHS = ("os.listdir", "os.scandir", "os.chdir", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
         "os.chmod", "os.chown", "os.link", "os.symlink", "os.truncate", "os.utime", "shutil.rmtree")
def inside(arg):
    path = os.path.realpath(os.fsdecode(arg))
    return path == root or path.startswith(root + os.sep)
def guard(event, args):
    if event in BLOCKED or event.startswith("ctypes."):
        raise PermissionError(f"sandbox: {event} is not allowed")
    paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))] if event in PATHS else []
    listing = event in ("os.listdir", "os.scandir")  # the import system lists the library's folders
    for a in paths:
        if not inside(a) and not (listing and os.path.realpath(os.fsdecode(a)).startswith(readable)):
            raise PermissionError(f"sandbox: {event} outside the working folder is not allowed")
    if event == "open" and isinstance(args[0], (str, bytes)):
        path = os.path.realpath(os.fsdecode(args[0]))
        flags = args[2] if isinstance(args[2], int) else 0
        reading = args[1] in (None, "r", "rb") and not flags & (os.O_WRONLY | os.O_RDWR)
        if not inside(path) and not (reading and path.startswith(readable)):
            raise PermissionError(f"sandbox: opening {path} is not allowed")
code = sys.stdin.read()
sys.addaudithook(guard)
exec(compile(code, "<tool>", "exec"), {"__name__": "__main__"})
"""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock
    cpu_s: int = 5
    memory_mb: int = 512  # address space
    processes: int = 64  # RLIMIT_NPROC (not enforced for root: the audit hook refuses forks anyway)
    file_mb: int = 16  # largest file the code may write
    max_output: int = 4000


def _limit(limits: Limits):
    def apply():
        os.setsid()  # its own process group: the timeout kills all of it
        mb = 2**20
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))  # SIGXCPU, then SIGKILL
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_python(code: str, limits: Limits = Limits()) -> tuple[str, bool]:
    """(what the code printed, or why it failed; whether it failed)."""
    folder = tempfile.mkdtemp(prefix="rlpost-sandbox-")
    library = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", GUARD, folder, *sorted(library)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=folder,
            env={},  # nothing of the host's environment
            preexec_fn=_limit(limits),
            text=True,
        )
        try:
            out, err = proc.communicate(code, timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            return f"error: timed out after {limits.timeout_s:g} s", True
        finally:  # timed out, or interrupted (the tool pool's alarm): none of it outlives the call
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if proc.returncode == 0:
        return out[: limits.max_output], False
    if proc.returncode < 0:
        why = {signal.SIGXCPU: f"used more than {limits.cpu_s} s of CPU", signal.SIGKILL: "was killed"}
        return f"error: {why.get(-proc.returncode, f'died of signal {-proc.returncode}')}", True
    last = err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}"
    return f"error: {last}"[: limits.max_output], True


@tool(name="python")
def python_tool(code: str) -> str:
    """Run Python code in a sandbox and return what it prints."""
    out, failed = run_python(code)
    if failed:
        raise RuntimeError(out.removeprefix("error: "))
    return out


@ENVS.register("python")
def python_env(row: EpisodeRow, options) -> ToolEnv:
    """The model may run Python (sandboxed) before it answers; a turn without a call is the answer."""
    return ToolEnv([python_tool], options)
