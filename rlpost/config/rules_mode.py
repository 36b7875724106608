"""The rules about keys that only one mode reads: set away from its default where the run does not
use that mode, a key is refused (it was ignored without a word: the eleventh catalogue's t44-t46).
Each is a named function of `rules.RULES`, with a violating example in tests/config/test_config.py."""

from __future__ import annotations

import dataclasses

from rlpost.config.rules import rule


def changed(section, skip: tuple[str, ...] = (), only=lambda field: True) -> list[str]:
    """`name=value` of the fields of `section` set away from their defaults."""
    out = []
    for f in dataclasses.fields(section):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if f.name not in skip and only(f) and getattr(section, f.name) != default:
            out.append(f"{f.name}={getattr(section, f.name)!r}")
    return out


@rule("cluster.placement")
def staleness_read_when_split(cfg):
    if cfg.cluster.placement != "split" and cfg.algo.max_staleness > 1:
        return (
            f"algo.max_staleness={cfg.algo.max_staleness} is read only with cluster.placement=split (generation "
            f"beside the update); cluster.placement={cfg.cluster.placement} is always synchronous: set "
            "cluster.placement=split, or leave algo.max_staleness out"
        )


@rule("env.name")
def env_keys_need_an_env(cfg):
    keys = changed(cfg.env, skip=("name",))
    if not cfg.env.name and keys:
        return (
            f"{', '.join('env.' + k for k in keys)}: read only by multi-turn episodes, and env.name is not set "
            "(single-turn): set env.name, or leave them out"
        )


@rule("rollout.backend")
def vllm_keys_need_vllm(cfg):
    keys = changed(cfg.rollout, only=lambda f: f.metadata.get("help", "").startswith("vllm"))
    if cfg.rollout.backend != "vllm" and keys:
        return (
            f"{', '.join('rollout.' + k for k in keys)}: read only by vLLM, and rollout.backend={cfg.rollout.backend}: "
            "set rollout.backend=vllm, or leave them out"
        )
