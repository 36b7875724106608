"""Environments and tools of multi-turn episodes (docs/environments.md)."""

from rlpost.envs import calculator, retry, sandbox  # noqa: F401  (register the built-in environments)
from rlpost.envs.base import ENVS, Environment, EnvStep, EpisodeRow, Turn, make_env, register_env
from rlpost.envs.tools import PARSERS, Tool, ToolCall, ToolEnv, register_parser, tool

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
    "register_env",
    "register_parser",
    "tool",
]
