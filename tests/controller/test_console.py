"""The quiet console: the libraries' progress bars and info lines off in the driver and, through
the actors' environment, in every actor, unless `logger.verbose=true`; what the user set wins.
(The quickstart's test checks a real run's console.)"""

import os

import pytest
import transformers

from rlpost.config import load_config
from rlpost.controller.cluster import QUIET_ENV, actor_env, quiet_libraries


@pytest.fixture
def clean_env(monkeypatch):
    for key in QUIET_ENV:
        monkeypatch.delenv(key, raising=False)
    transformers.utils.logging.enable_progress_bar()  # as a fresh process has it (a run earlier turned it off)
    yield
    transformers.utils.logging.enable_progress_bar()


def test_verbose_keeps_the_libraries_output(clean_env):
    cfg = load_config(["logger.verbose=true"])
    quiet_libraries(cfg.logger.verbose)
    assert not any(key in os.environ for key in QUIET_ENV)
    assert transformers.utils.logging.is_progress_bar_enabled()
    env = actor_env(cfg)
    assert not any(key in env for key in (*QUIET_ENV, "PYTHONWARNINGS", "TQDM_DISABLE"))


def test_quiet_by_default_here_and_in_the_actors(clean_env):
    cfg = load_config([])
    quiet_libraries(cfg.logger.verbose)
    assert {key: os.environ[key] for key in QUIET_ENV} == QUIET_ENV
    assert not transformers.utils.logging.is_progress_bar_enabled()
    env = actor_env(cfg)
    assert {key: env[key] for key in QUIET_ENV} == QUIET_ENV and env["PYTHONWARNINGS"] == "ignore"
    assert env["TQDM_DISABLE"] == "1"  # the actors' bars (vLLM's CUDA-graph capture); the driver keeps its own


def test_what_the_user_set_wins(clean_env, monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    quiet_libraries(False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert actor_env(load_config([]))["VLLM_LOGGING_LEVEL"] == "DEBUG"
