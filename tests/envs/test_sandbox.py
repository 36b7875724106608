"""The sandboxed Python tool: code that tries to get out is stopped, attempt by attempt (a file
outside its folder, a socket, a fork bomb, 10 GB of memory, endless CPU, a sleep past the wall
clock, the host's environment, a process, native code), while ordinary code runs and prints."""

import glob
import os
import tempfile

import pytest

from rlpost.config.schema import EnvConfig
from rlpost.envs import ToolEnv, Turn
from rlpost.envs.sandbox import Limits, python_tool, run_python

FAST = Limits(timeout_s=3, cpu_s=1, memory_mb=512)


def test_ordinary_code_runs_with_the_standard_library_and_its_own_folder():
    code = "import json, math\nopen('a.txt', 'w').write('x')\nprint(json.dumps([math.isqrt(17), open('a.txt').read()]))"
    assert run_python(code, FAST) == ('[4, "x"]\n', False)
    assert run_python("raise ValueError('bad input')", FAST) == ("error: ValueError: bad input", True)


@pytest.mark.parametrize(
    "attempt, stopped_by",
    [
        ("print(open('/etc/hostname').read())", "opening /etc/hostname is not allowed"),
        (f"open('{tempfile.gettempdir()}/escaped.txt', 'w').write('x')", "escaped.txt is not allowed"),
        ("import os; print(os.listdir('/'))", "os.listdir outside the working folder is not allowed"),
        ("import os; os.chdir('..')", "os.chdir outside the working folder is not allowed"),
        ("import socket; socket.socket().connect(('127.0.0.1', 22))", "socket.__new__ is not allowed"),
        ("import os\nwhile True:\n    os.fork()", "os.fork is not allowed"),
        ("import subprocess; subprocess.run(['sh', '-c', 'echo hi'])", "subprocess.Popen is not allowed"),
        ("import os; os.system('echo hi')", "os.system is not allowed"),
        ("import os; os.kill(1, 9)", "os.kill is not allowed"),
        ("import ctypes", "ctypes.dlopen is not allowed"),
        ("x = bytearray(10 * 2**30)", "MemoryError"),
        ("while True:\n    pass", "used more than 1 s of CPU"),
        ("import time; time.sleep(60)", "timed out after 3 s"),
    ],
    ids=lambda v: v[:30] if isinstance(v, str) else None,
)
def test_each_escape_is_stopped(attempt, stopped_by):
    out, failed = run_python(attempt, FAST)
    assert failed and stopped_by in out, out
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), "escaped.txt"))


def test_nothing_of_the_host_and_no_folder_is_left(monkeypatch):
    monkeypatch.setenv("RLPOST_SECRET", "hunter2")
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "rlpost-sandbox-*")))
    out, failed = run_python("import os; print(sorted(os.environ), os.getcwd())", FAST)
    assert not failed and "RLPOST_SECRET" not in out and "hunter2" not in out
    assert "rlpost-sandbox-" in out and not os.path.exists(out.split()[-1])
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "rlpost-sandbox-*"))) == before


def test_the_python_tool_in_an_environment():
    env = ToolEnv([python_tool], EnvConfig(tool_timeout_s=30))
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    assert env.step(Turn(call, (), 0)).messages == [{"role": "tool", "content": "42\n"}]
    bad = '<tool_call>{"name": "python", "arguments": {"code": "open(\'/etc/hostname\')"}}</tool_call>'
    step = env.step(Turn(bad, (), 0))
    assert step.tool_errors == 1 and "opening /etc/hostname is not allowed" in step.messages[0]["content"]
