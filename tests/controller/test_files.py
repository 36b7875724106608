"""controller/files.py: the export's claim, and the OSError behind a failed checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlpost.controller import files
from rlpost.controller.files import os_error_in, take_claim


def test_the_oserror_is_found_through_causes_contexts_and_each_ranks_failures():
    full = OSError(28, "No space left on device")
    ray_error = RuntimeError("task failed")
    ray_error.cause = full  # Ray's task errors keep theirs in `cause`
    assert os_error_in(ray_error) is full
    dcp = RuntimeError("CheckpointException")  # DCP's: one (exception, traceback) pair or exception a rank
    dcp.failures = {0: ValueError("rank 0 read no errno"), 1: (full, "traceback")}
    assert os_error_in(dcp) is full
    dcp.failures = {0: (ValueError("first"), "tb"), 1: full}  # a bare exception, after one that leads nowhere
    assert os_error_in(dcp) is full
    assert os_error_in(OSError("no errno")) is None  # a raw OSError without an errno is not a disk's


def test_a_cycle_of_contexts_ends_the_search():
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert os_error_in(a) is None


def test_a_live_process_claim_is_kept_and_left_unsignalled(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim = tmp_path / ".rlpost-export"
        claim.write_text(str(holder.pid))
        with pytest.raises(FileExistsError):
            take_claim(claim)
        assert holder.poll() is None  # only asked whether it lives (signal 0)
        assert claim.read_text() == str(holder.pid)
    finally:
        holder.kill()
        holder.wait()


def test_an_empty_claim_is_taken_once_it_is_old(tmp_path):
    claim = tmp_path / ".rlpost-export"
    claim.write_text("")
    old = claim.stat().st_mtime - 5.5
    os.utime(claim, (old, old))  # an empty claim 5.5 s old: its writer never wrote its id
    take_claim(claim)
    assert claim.read_text() == str(os.getpid())


def test_a_claim_that_goes_while_it_is_checked_is_taken(tmp_path, monkeypatch):
    claim = tmp_path / ".rlpost-export"
    claim.write_text("12345")

    def gone(pid, sig):  # its process ends and its claim goes between the read and the check
        claim.unlink()
        raise ProcessLookupError(pid)

    monkeypatch.setattr(files.os, "kill", gone)
    take_claim(claim)
    assert claim.read_text() == str(os.getpid())


def test_a_claim_remade_by_dead_processes_twice_is_refused_by_name(tmp_path, monkeypatch):
    claim, tries = tmp_path / ".rlpost-export", []
    real_open = os.open

    def remade(path, flags, *args):  # each time the claim is let go, a process that then dies makes it again
        tries.append(path)
        claim.write_text("12345")
        return real_open(path, flags, *args)

    monkeypatch.setattr(files.os, "open", remade)
    monkeypatch.setattr(files.os, "kill", lambda pid, sig: (_ for _ in ()).throw(ProcessLookupError(pid)))
    with pytest.raises(FileExistsError, match=r"\.rlpost-export"):
        take_claim(claim)
    assert len(tries) == 2
