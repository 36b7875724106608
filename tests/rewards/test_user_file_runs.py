"""A user's reward file runs only where its function is called: the CLI's early check reads it
without running it (a file that loads a judge model at import would load it in the driver), and
the first try before the actors runs in the run's own reward pool, whose workers keep it."""

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller.reward_checks import check_reward_values
from rlpost.controller.workers import Workers
from rlpost.data.dataset import PromptRow
from rlpost.rewards import RewardInput
from rlpost.rewards.base import check_reward_fn

COUNTING = """
import os
with open(os.environ["RUNS_LOG"], "a") as f:  # one line each time this file runs
    f.write("ran\\n")

def score(sample):
    return 1.0
"""


@pytest.fixture
def counting(tmp_path, monkeypatch):
    log = tmp_path / "runs.log"
    monkeypatch.setenv("RUNS_LOG", str(log))
    (tmp_path / "judge.py").write_text(COUNTING)
    return f"{tmp_path}/judge.py:score", log


def runs(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_the_cli_check_does_not_run_the_file(counting):
    spec, log = counting
    check_reward_fn(spec)
    assert runs(log) == 0


@pytest.mark.parametrize(
    "source, error, message",
    [
        ("def f(sample):\n    return 1 +\n", ValueError, "bad.py line 2: SyntaxError: invalid syntax"),
        ("def g(sample):\n    return 1\nf_not = 2\n", AttributeError, "bad.py defines no function 'f'"),
        ("async def f(sample):\n    return 1\n", ValueError, "f is an async function, which rlpost does not await"),
    ],
)
def test_the_cli_check_refuses_what_it_can_see_without_running(tmp_path, source, error, message):
    (tmp_path / "bad.py").write_text(source)
    with pytest.raises(error, match=message):
        check_reward_fn(f"{tmp_path}/bad.py:f")


@pytest.mark.parametrize(
    "source",
    [
        "if True:\n    def f(sample):\n        return 1\n",  # bound in a block
        "f = lambda sample: 1\n",
        "from math import *\n",  # may bind it
        "globals()['f'] = lambda sample: 1\n",
        "import os as f\n",  # bound (not a function: the first try will say)
    ],
)
def test_the_cli_check_passes_a_file_that_binds_the_name_or_may(tmp_path, source):
    (tmp_path / "ok.py").write_text(source)
    check_reward_fn(f"{tmp_path}/ok.py:f")


def test_the_cli_check_of_names_and_auto():
    check_reward_fn("auto")
    check_reward_fn("arithmetic")
    with pytest.raises(KeyError, match="reward.fn='nope' is not a registered reward"):
        check_reward_fn("nope")


def test_the_file_runs_once_a_worker_of_the_runs_pool_and_the_first_try_is_one_of_them(counting):
    spec, log = counting
    cfg = load_config(["+recipe=quickstart", f"reward.fn={spec}", "reward.num_workers=2"])
    workers = Workers()
    try:
        pool = workers.pool(cfg)
        assert runs(log) == 1  # the pool's first worker, as the run starts (before any model)
        assert workers.pool(cfg) is pool
        check_reward_values(cfg, [PromptRow([1], "2+2=", "4", "arithmetic")], pool=pool)
        assert runs(log) == 2  # the try went to the second worker
        assert pool.score([RewardInput("2+2=", "4", "4", "arithmetic")] * 4).scores == [1.0] * 4
        assert runs(log) == 2  # both kept what they ran
    finally:
        workers.pool(cfg).close()


def test_without_a_pool_the_try_closes_its_own(counting):
    spec, log = counting
    cfg = load_config(["+recipe=quickstart", f"reward.fn={spec}"])
    check_reward_values(cfg, [PromptRow([1], "2+2=", "4", "arithmetic")])
    assert runs(log) == 1


def test_a_file_that_fails_as_it_runs_stops_the_run_as_its_pool_is_made(tmp_path):
    (tmp_path / "boom.py").write_text("raise RuntimeError('no judge here')\ndef f(sample):\n    return 1\n")
    spec = f"{tmp_path}/boom.py:f"
    check_reward_fn(spec)  # nothing to see without running it
    cfg = load_config(["+recipe=quickstart", f"reward.fn={spec}"])
    with pytest.raises(ConfigError) as info:
        Workers().pool(cfg)
    assert str(info.value) == (
        f"reward.fn='{spec}' could not be loaded: ValueError: reward.fn='{spec}': running {tmp_path}/boom.py raised "
        "RuntimeError at line 1: no judge here"
    )
