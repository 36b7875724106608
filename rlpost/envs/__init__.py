"""Environments and tools of multi-turn episodes (docs/environments.md)."""

from rlpost.envs import calculator, retry, sandbox  # noqa: F401  (register the built-in environments)
from rlpost.envs.base import ENVS, Environment, EnvStep, EpisodeRow, Turn, make_env
from rlpost.envs.tools import PARSERS, Tool, ToolCall, ToolEnv, tool

__all__ = [
    "ENVS",
    "PARSERS",
    "Environment",
    "EnvStep",
    "EpisodeRow",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "Turn",
    "make_env",
    "tool",
]
