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
    cfg = load_config(["+recipe=quickstart", "logger.verbose=true"])
    quiet_libraries(cfg.logger.verbose)
    assert not any(key in os.environ for key in QUIET_ENV)
    assert transformers.utils.logging.is_progress_bar_enabled()
    env = actor_env(cfg)
    assert not any(key in env for key in (*QUIET_ENV, "PYTHONWARNINGS", "TQDM_DISABLE"))


def test_quiet_by_default_here_and_in_the_actors(clean_env):
    cfg = load_config(["+recipe=quickstart"])
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
    assert actor_env(load_config(["+recipe=quickstart"]))["VLLM_LOGGING_LEVEL"] == "DEBUG"


def test_the_actors_environment_exactly(clean_env, monkeypatch):
    """cluster.num_threads for the math libraries, no tokenizer threads, and of the driver's own
    variables exactly the NCCL_*, VLLM_*, HF_HUB_OFFLINE and PYTHONPATH ones."""
    for key in [k for k in os.environ if k.startswith(("NCCL_", "VLLM_", "nccl_", "vllm_"))]:
        monkeypatch.delenv(key)
    mine = {"NCCL_NVLS_ENABLE": "0", "VLLM_USE_V1": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": "/x"}
    for key, value in (mine | {"nccl_lower": "1", "vllm_lower": "1", "HF_HOME": "/h", "MY_OWN": "1"}).items():
        monkeypatch.setenv(key, value)
    env = actor_env(load_config(["+recipe=quickstart", "cluster.num_threads=3", "logger.verbose=true"]))
    threads = {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3", "TOKENIZERS_PARALLELISM": "false"}
    assert env == threads | mine
