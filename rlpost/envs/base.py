"""The environment of a multi-turn episode (agentic RL), and the registry of environments.

An episode starts from a prompt row (its first messages are the row's prompt, rendered with the
environment's `tools` where the prompt is chat messages). The model takes a turn; the environment
reads it (`step(Turn)`) and answers with the next messages (tool results, feedback), a reward for
the turn if it has one, and whether the episode is over. The runner (`rlpost.rollout.episodes`)
keeps the model's tokens exactly as sampled and renders the environment's messages through the
chat template as tokens that get no loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from rlpost.data.userfile import load_from_file
from rlpost.registry import Registry


@dataclass(frozen=True)
class Turn:
    """One turn of the model: its text (special tokens left out) and its tokens as sampled."""

    text: str
    token_ids: tuple[int, ...]
    index: int  # 0 for the first turn of the episode


@dataclass
class EnvStep:
    """What the environment answers to a turn."""

    messages: list[dict] = field(default_factory=list)  # chat messages: {"role": "tool", "content": ...}
    reward: float = 0.0  # added to the episode's reward
    done: bool = False
    tool_calls: int = 0  # calls the turn made (metrics)
    tool_errors: int = 0  # of them: unparsable, unknown tool, bad arguments, raised, timed out


class Environment(Protocol):
    tools: list  # `rlpost.envs.tools.Tool`s the prompt advertises (may be empty)

    def step(self, turn: Turn) -> EnvStep: ...


@dataclass(frozen=True)
class EpisodeRow:
    """What an environment is created from: one prompt row."""

    prompt_text: str
    ground_truth: str
    data_source: str


# `@ENVS.register(name)` over a factory `(row, options) -> Environment` makes it `env.name=<name>`;
# `options` is the run's `env` config section (`tool_parser`, `tool_timeout_s`, ...). A user's file
# is run again by each `file.py:factory` that names it, and by tool workers: its registrations
# replace the earlier ones.
ENVS: Registry[Callable[[EpisodeRow, object], Environment]] = Registry(
    "environment", key="env.name", others="file.py:factory", replace=True
)


def env_factory(name: str) -> Callable[[EpisodeRow, object], Environment]:
    """A registered environment, or `path/to/file.py:factory` (the file may register tool parsers
    too: it is imported before the environment is made)."""
    if name in ENVS or ":" not in name:
        return ENVS.get(name)
    return ENVS.register(name, load_from_file(name, "env.name"))


def make_env(name: str, row: EpisodeRow, options) -> Environment:
    return env_factory(name)(row, options)
