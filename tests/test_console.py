"""The command's console (rlpost/console.py): a reader that goes away (`rlpost train ... | head`)
and a terminal that cannot show a character do not end the run (the seventh catalogue's s15 and
s19: a BrokenPipeError or UnicodeEncodeError from a warning ended runs before their first step)."""

from __future__ import annotations

import os
import subprocess
import sys

from rlpost.cli import main

WRITER = """
import sys
{setup}
for _ in range(2000):
    print("x" * 100)  # 200 KB: more than a pipe holds once its reader has gone
print("after: é", file=sys.stderr)
"""
STEADY = "from rlpost.console import steady_console; steady_console()"


def write_into_a_closed_pipe(setup: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    writer = subprocess.Popen([sys.executable, "-c", WRITER.format(setup=setup)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)  # fmt: skip
    writer.stdout.readline()
    writer.stdout.close()  # the reader quits, as `head -1` does
    err = writer.stderr.read().decode()
    return writer.wait(timeout=60), err


def test_a_reader_that_goes_away_does_not_end_the_command():
    code, err = write_into_a_closed_pipe(STEADY)
    assert (
        code == 0
        and "the reader of its stdout went away (a closed pipe): what it prints there is dropped; a run goes on" in err
    )
    assert "after: é" in err and "Traceback" not in err
    code, err = write_into_a_closed_pipe("")  # what happened before
    assert code != 0 and "BrokenPipeError" in err


def test_a_character_the_terminal_cannot_show_is_written_escaped():
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "PYTHONPATH": os.getcwd()}
    code = f"{STEADY}\nprint('10+20=\\u00e9')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout == b"10+20=\\xe9\n"
    plain = subprocess.run([sys.executable, "-c", "print('10+20=\\u00e9')"], capture_output=True, env=env, timeout=60)
    assert plain.returncode != 0 and b"UnicodeEncodeError" in plain.stderr


def test_help_is_asked_for_and_goes_to_stdout(capsys):
    assert main(["-h"]) == 0 and "rlpost train | data" in capsys.readouterr().out
    assert main(["trian"]) == 2 and "unknown command 'trian'" in capsys.readouterr().err


def test_the_actors_lines_are_plain_where_the_console_takes_no_colour(monkeypatch):
    """The ninth catalogue's n38: with NO_COLOR, TERM=dumb or output to a file, Ray's prefixes of
    the actors' lines still came with colour codes (`RAY_COLOR_PREFIX=0` is set then)."""
    from types import SimpleNamespace

    from rlpost.controller import cluster

    for tty, env, plain in [(True, {}, False), (False, {}, True), (True, {"NO_COLOR": "1"}, True),
                            (True, {"TERM": "dumb"}, True)]:  # fmt: skip
        monkeypatch.setattr(cluster.sys, "stdout", SimpleNamespace(isatty=lambda tty=tty: tty))
        monkeypatch.delenv("NO_COLOR", raising=False)
        monkeypatch.setenv("TERM", "xterm")
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert cluster.plain_text() == plain, (tty, env)
