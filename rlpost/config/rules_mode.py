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


def given(section, *names: str) -> list[str]:
    """`name=value` of the fields `names` of `section` set away from their defaults."""
    return changed(section, only=lambda f: f.name in names)


def unread(keys: list[str], prefix: str, why: str) -> str | None:
    """The refusal of `keys` (of `prefix`'s section) that the run does not read: `why`, and to leave them out."""
    if keys:
        return f"{', '.join(prefix + k for k in keys)}: {why}, or leave {'them' if len(keys) > 1 else 'it'} out"
    return None


# The fourteenth catalogue's t13-t16: keys read only under a switch the run has off were taken and ignored.
@rule("algo.async_rollouts")
def stale_groups_read_when_async(cfg):
    return unread(given(cfg.algo, "stale_groups"), "algo.", "read only with algo.async_rollouts=true: set it")


@rule("logger.backends")
def wandb_keys_need_wandb(cfg):  # (the seventeenth catalogue's t02: wandb_mode=online with no W&B tracker)
    if "wandb" not in cfg.logger.backends:
        why = f"read only by the wandb tracker, and logger.backends={list(cfg.logger.backends)} has none: add wandb"
        return unread(given(cfg.logger, "project", "wandb_mode"), "logger.", why)


@rule("trainer.val_every")
def val_greedy_needs_validation(cfg):  # (t02)
    if not cfg.trainer.val_every:
        why = "read only by validation, and trainer.val_every=0: set it"
        return unread(given(cfg.rollout, "val_greedy"), "rollout.", why)


@rule("algo.name")
def filter_rounds_need_a_filter(cfg):
    from rlpost.algos.algorithms import ALGORITHMS

    if ALGORITHMS.get(cfg.algo.name).batch_filter == "none":
        filtered = ", ".join(n for n, a in ALGORITHMS.items() if a.batch_filter != "none")
        why = f"read only by algorithms with a batch filter ({filtered}), and algo.name={cfg.algo.name} has none"
        return unread(given(cfg.algo, "max_filter_rounds"), "algo.", f"{why}: choose one of those")


@rule("algo.rollout_is")
def is_threshold_needs_a_correction(cfg):
    if cfg.algo.rollout_is == "none":
        why = "the importance correction's cap, and algo.rollout_is=none: set algo.rollout_is"
        return unread(given(cfg.algo, "rollout_is_threshold"), "algo.", why)


@rule("algo.kl_target")
def kl_horizon_needs_a_target(cfg):
    """(Not `kl_estimator` under `kl_coef=0`: recipes set an estimator, and `kl_coef=0` is how a user
    turns their KL off.)"""
    if cfg.algo.kl_target == 0:
        why = "read only by the adaptive KL coefficient, and algo.kl_target=0: set algo.kl_target"
        return unread(given(cfg.algo, "kl_horizon"), "algo.", why)


@rule("algo.overlong_buffer")
def overlong_penalty_needs_a_buffer(cfg):
    if cfg.algo.overlong_buffer == 0:
        why = "read only with the soft overlong punishment, and algo.overlong_buffer=0: set algo.overlong_buffer"
        return unread(given(cfg.algo, "overlong_penalty"), "algo.", why)


def optim_keys(cfg, name: str, off) -> list[str]:
    """`trainer.optim.NAME=...` / `critic.optim.NAME=...` set where `off(that optim section)` holds."""
    return [
        f"{role}.optim.{k}"
        for role in ("trainer", "critic")
        if off(o := getattr(cfg, role).optim)
        for k in given(o, name)
    ]


@rule("trainer.optim.offload")
def prefetch_needs_layerwise(cfg):
    why = "read only by the layerwise optimizer, and its optim.offload (trainer.optim.offload, critic.optim.offload) "
    keys = optim_keys(cfg, "prefetch_layers", lambda o: o.offload != "layerwise")
    return unread(keys, "", why + "is not layerwise: set it to layerwise")


@rule("trainer.optim.lr_schedule")
def min_lr_needs_a_decay(cfg):
    why = "read only by the cosine schedule, and its optim.lr_schedule=constant (trainer.optim.lr_schedule, "
    keys = optim_keys(cfg, "min_lr_ratio", lambda o: o.lr_schedule == "constant")
    return unread(keys, "", why + "critic.optim.lr_schedule): set it to cosine")


@rule("model.lora.rank")
def lora_mode_needs_a_rank(cfg):
    """(Not `alpha`: a recipe may set it for a rank given on the command line, as gpu_quickstart does.)"""
    if cfg.model.lora.rank == 0:  # (the fourteenth catalogue's t24: a full fine-tune without a word)
        return unread(
            given(cfg.model.lora, "mode"), "model.lora.", "read only with LoRA, and model.lora.rank=0: set it"
        )


@rule("reward.model.kind")
def classifier_keys_need_a_classifier(cfg):
    m = cfg.reward.model
    if m.path and m.kind == "causal_lm":  # (t25: the user's score_fn reads the model; these are the classifier's)
        why = "read only by a classifier reward model, and reward.model.kind=causal_lm scores with score_fn"
        return unread(given(m, "sigmoid", "max_length", "batch_size"), "reward.model.", why)


@rule("cluster.stall_warn_s")
def stall_warning_before_the_stop(cfg):
    c = cfg.cluster
    if given(c, "stall_warn_s") and c.stall_warn_s >= c.stall_timeout_s:  # (t26: the warning could never come;
        # a timeout below the default warning alone is a short run's choice, not refused)
        return (
            f"cluster.stall_warn_s={c.stall_warn_s:g} is not below cluster.stall_timeout_s={c.stall_timeout_s:g}: a "
            "stalled call would stop the run before it is ever said; set stall_warn_s below the timeout"
        )
