"""tests/conftest.py's RLPOST_HARD_EXIT: the GPU runs' pytest ends after its summary and JUnit file
even when something it started would hold the interpreter's exit, with pytest's own exit status."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HELD = """
import threading, time

def test_holds_the_exit():
    threading.Thread(target=time.sleep, args=(300,)).start()  # not a daemon: the interpreter waits for it

def test_fails():
    assert False
"""


def test_hard_exit_ends_a_held_run_with_pytests_status(tmp_path):
    (tmp_path / "test_held.py").write_text(HELD)
    junit = tmp_path / "junit.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"]
    argv += [str(tmp_path / "test_held.py"), f"--junitxml={junit}", "--rootdir", str(tmp_path)]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RLPOST_HARD_EXIT": "1"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]  # one test failed: pytest's 1
    assert "1 failed, 1 passed" in done.stdout
    assert 'failures="1"' in junit.read_text()
