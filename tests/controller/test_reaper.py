"""A killed controller leaves no processes behind (controller/reaper.py; issue 39 item 3): the
watcher stops what was started under the controller once the controller is gone, and nothing else."""

import os
import signal
import subprocess
import sys
import time

import pytest

from rlpost.controller import reaper

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")

# a "controller": starts a child that starts a grandchild (as the raylet starts its agents), prints
# their pids, then waits to be killed
CONTROLLER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import subprocess, sys, time
grand = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(grand.pid, flush=True)
time.sleep(600)
'''], stdout=subprocess.PIPE, text=True)
grand = child.stdout.readline().strip()
print(child.pid, grand, flush=True)
time.sleep(600)
"""


def gone_within(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(not os.path.exists(f"/proc/{p}") or reaper.stat_of(p)[0] == "Z" for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_a_killed_controllers_children_and_grandchildren_are_stopped_and_nothing_else():
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER], stdout=subprocess.PIPE, text=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # not under it
    watcher = None
    try:
        child, grand = map(int, controller.stdout.readline().split())
        watch = f"from rlpost.controller.reaper import watch; watch({controller.pid}, every=0.2, grace=0.5)"
        watcher = subprocess.Popen([sys.executable, "-c", watch])
        time.sleep(1.5)  # it has noted them
        assert reaper.descendants(controller.pid).keys() == {child, grand}
        assert watcher.poll() is None and not gone_within([child, grand], 0.5)  # alive while the controller is
        controller.send_signal(signal.SIGKILL)
        controller.wait()
        assert gone_within([child, grand], 10), "the killed controller's processes are still alive"
        assert watcher.wait(10) == 0  # and the watcher ends
        assert bystander.poll() is None  # a process not under the controller is left alone
    finally:
        for p in (controller, bystander, watcher):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_a_pid_given_to_another_process_since_is_left_alone():
    """A noted pid whose start time is not the noted one (the system gave it to a new process) is
    not signalled; a noted process that is alive gets SIGTERM first."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        start = reaper.stat_of(p.pid)[2]
        reaper.stop({p.pid: start + 1}, grace=0.2)
        assert p.poll() is None
        reaper.stop({p.pid: start}, grace=5)
        assert p.wait(5) == -signal.SIGTERM  # stopped by the SIGTERM, within the grace
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_process_that_ignores_sigterm_gets_sigkill_after_the_grace():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        p.stdout.readline()  # its handler is in place
        start = time.monotonic()
        reaper.stop({p.pid: reaper.stat_of(p.pid)[2]}, grace=0.5)
        assert p.wait(5) == -signal.SIGKILL and time.monotonic() - start >= 0.5
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_one_watcher_a_process_and_it_ends_with_the_process():
    """start_watcher twice gives the same watcher; it is in a session of its own (a Ctrl-C on the
    terminal does not reach it), and watching a pid that does not exist ends at once."""
    code = (
        "from rlpost.controller import reaper; a = reaper.start_watcher(); b = reaper.start_watcher(); "
        "import os; print(a is b, os.getsid(a.pid) == a.pid, a.pid, flush=True)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    same, own_session, pid = out.stdout.split()
    assert same == "True" and own_session == "True"
    assert gone_within([int(pid)], 10)  # its process ended: the watcher stopped what it noted and ended
    start = time.monotonic()
    reaper.watch(2**22 + 12345)  # no such process
    assert time.monotonic() - start < 1
