"""Reward files as users write them (the second catalogue of bad inputs, issue 39): a function
written for another framework's signature is refused before any actor starts; a file imports the
modules beside it; a worker whose parent closed the pipe ends without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller.reward_checks import check_reward_values
from rlpost.data.dataset import PromptRow
from rlpost.rewards import RewardInput
from rlpost.rewards.pool import RewardPool

REPO = Path(__file__).resolve().parents[1]
ROW = PromptRow([1, 2], "1+2=", "3", "mine")


def test_a_reward_with_another_frameworks_signature_stops_the_run_at_its_first_try(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("def reward(prompt, response, ground_truth):\n    return float(response == ground_truth)\n")
    cfg = load_config(["+recipe=quickstart", f"reward.fn={path}:reward"])
    with pytest.raises(ConfigError) as info:
        check_reward_values(cfg, [ROW], log=lambda *_: None)
    assert str(info.value) == (
        f"reward.fn='{path}:reward' could not be loaded: TypeError: reward.fn='{path}:reward' takes "
        "reward(prompt, response, ground_truth), but a reward function is called with one sample (missing a "
        "required argument: 'response'): read sample.prompt, sample.response, sample.ground_truth and "
        "sample.data_source from its one argument"
    )
    path.write_text("def reward(sample, scale):\n    return scale\n")  # a keyword reward.kwargs must give
    with pytest.raises(ConfigError, match=r"takes reward\(sample, scale\).* \(missing a required argument: 'scale'"):
        check_reward_values(cfg, [ROW], log=lambda *_: None)
    said = []  # given, it scores
    check_reward_values(load_config([*cfg_args(path), "+reward.kwargs.scale=1.0"]), [ROW], log=said.append)
    assert said == []


def cfg_args(path):
    return ["+recipe=quickstart", f"reward.fn={path}:reward"]


def test_a_reward_file_imports_the_modules_beside_it(tmp_path):
    (tmp_path / "helper_mod_for_rlpost_test.py").write_text("def right(s):\n    return s.response == s.ground_truth\n")
    (tmp_path / "r.py").write_text(
        "from helper_mod_for_rlpost_test import right\n\ndef reward(sample):\n    return float(right(sample))\n"
    )
    pool = RewardPool(f"{tmp_path / 'r.py'}:reward", {}, 1, timeout_s=5, memory_mb=0, error_score=-1.0)
    try:
        out = pool.score([RewardInput("1+2=", "3", "3", "x"), RewardInput("1+2=", "4", "3", "x")])
    finally:
        pool.close()
    assert out.scores == [1.0, 0.0] and out.first_error is None


CLOSE_EARLY = """
import multiprocessing as mp, sys
from rlpost.rewards.executor import _worker

def setup():
    return lambda sample: 1.0

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(child, setup, 0, "reward.timeout_s"))
    proc.start()
    assert parent.recv() == "ready"
    parent.send(([1, 2], 5.0))  # a chunk under way when the parent goes
    parent.close()
    proc.join(30)
    sys.exit(proc.exitcode)
"""


def test_a_worker_whose_parent_closed_the_pipe_ends_quietly(tmp_path):
    """The parent stopped (or replaced the worker) with a chunk under way: the worker's answer
    finds the pipe closed, and it ends without a traceback (it printed one after the summary)."""
    script = tmp_path / "close_early.py"
    script.write_text(CLOSE_EARLY)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
