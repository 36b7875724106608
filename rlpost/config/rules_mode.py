"""The rules about keys that only one mode reads: set away from its default where the run does not
use that mode, a key is refused (it was ignored without a word: the eleventh catalogue's t44-t46).
Each is a named function of `rules.RULES`, with a violating example in tests/config/test_config.py."""

from __future__ import annotations

import dataclasses

from rlpost.config.rules import rule


def changed(section, skip: tuple[str, ...] = (), only=lambda field: True) -> list[str]:
    """`name=value` of the fields of `section` set away from their defaults (`optim.lr=0.5` within a
    section of a section)."""
    out = []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if f.name in skip or not only(f) or value == default:
            continue
        inner = changed(value) if dataclasses.is_dataclass(value) else [f"={value!r}"]
        out += [f"{f.name}{'' if part.startswith('=') else '.'}{part}" for part in inner]
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


@rule("algo.name")
def critic_keys_need_a_critic(cfg):
    from rlpost.algos.algorithms import ALGORITHMS

    keys = changed(cfg.critic)
    if keys and "critic" not in ALGORITHMS.get(cfg.algo.name).roles:  # (the twelfth catalogue's t197)
        with_critic = ", ".join(name for name, algo in ALGORITHMS.items() if "critic" in algo.roles)
        return (
            f"{', '.join('critic.' + k for k in keys)}: read only by algorithms with a critic ({with_critic}), "
            f"and algo.name={cfg.algo.name} has none: leave them out, or choose one of those"
        )


@rule("reward.model.path")
def reward_model_keys_need_a_model(cfg):
    keys = changed(cfg.reward.model, skip=("path",))
    if keys and not cfg.reward.model.path:  # (the twelfth catalogue's t198)
        return (
            f"{', '.join('reward.model.' + k for k in keys)}: read only with a reward model, and reward.model.path "
            "is not set: set reward.model.path, or leave them out"
        )


@rule("data.task")
def task_keys_need_their_task(cfg):
    """(Rows from files read none of these: a recipe's task keys are not refused when its task is
    replaced by data.train_files.)"""
    from rlpost.data.tasks import TASKS

    if not cfg.data.task:
        return None
    readers = {key: [n for n, t in TASKS.items() if key in t.reads] for _, t in TASKS.items() for key in t.reads}
    reads = TASKS.get(cfg.data.task).reads
    keys = changed(cfg.data, only=lambda f: f.name in readers and f.name not in reads)
    if keys:  # (the twelfth catalogue's t196: data.train_size with a task that trains on every problem)
        names = [k.split("=")[0].split(".")[0] for k in keys]
        by = "; ".join(f"data.{name} by {', '.join(readers[name])}" for name in dict.fromkeys(names))
        listed = ", ".join("data." + k for k in keys)
        return f"{listed}: read only by other offline tasks ({by}), and data.task={cfg.data.task}: leave them out"
