"""Validation: every key's allowed values (declared with the key in `schema.py`: a closed set or a
range) and the rules that span keys (`RULES`), each a named function that returns what is wrong,
naming the key at fault and what would fix it, or None. Adding a rule is one decorated function
here (about the machine, kernels and the profiler: `rules_machine.py`; keys an algorithm may not
read: `rules_algo.py`) and one violating example in
tests/config/test_config.py (a test walks them all)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlpost.config.model_folder import missing_folder
from rlpost.config.placement import Colocation
from rlpost.config.schema import ConfigError, TrainConfig, iter_fields
from rlpost.registry import Registry


def _get(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _out_of_range(value, bounds: dict) -> str | None:
    """The bound `value` breaks, as text (`must be > 0`), or None."""
    for op, limit in bounds.items():
        ok = {"ge": value >= limit, "gt": value > limit, "le": value <= limit, "lt": value < limit}[op]
        if not ok:
            return range_text({op: limit})
    return None


def range_text(bounds: dict) -> str:  # a float as :g, an int whole (2147483647, not 2.14748e+09)
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return " and ".join(f"{words[op]} {f'{v:g}' if isinstance(v, float) else v}" for op, v in bounds.items())


@dataclass(frozen=True)
class Rule:
    """A check that spans keys: `check(cfg)` returns what is wrong (naming `key`) or None."""

    name: str
    key: str
    check: Callable[[TrainConfig], str | None]
    this_machine: bool = False  # about the machine that reads the config (a GPU, a package)


RULES: list[Rule] = []


def rule(key: str, this_machine: bool = False):
    def wrap(fn):
        RULES.append(Rule(fn.__name__, key, fn, this_machine))
        return fn

    return wrap


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@rule("data.train_files")
def rows_to_train_on(cfg):
    if not (d := cfg.data).task and not d.train_files:
        return "data.train_files is empty and data.task is not set: give rows to train on"
    if d.task and (d.train_files or d.val_files):
        return f"data.train_files/val_files are ignored while data.task={d.task} makes the rows: set data.task="
    real = [os.path.realpath(os.path.expanduser(f)) for f in d.train_files]  # one file, two spellings
    if twice := [(f, d.train_files[real.index(real[i])]) for i, f in enumerate(d.train_files) if real[i] in real[:i]]:
        same = "more than once" if twice[0][0] == twice[0][1] else f"and {twice[0][1]}, the same file"  # (cat10's t72)
        return f"data.train_files lists {twice[0][0]} {same} (its rows trained on as many times): list it once"


@rule("data.task")
def tiny_model_task(cfg):
    from rlpost.data.tasks import TASKS

    task = TASKS.get(cfg.data.task) if cfg.data.task else None
    if cfg.model.path == "tiny" and task is not None and not task.tiny:
        tiny = [name for name, t in TASKS.items() if t.tiny]
        return (
            f"data.task={task.name} writes chat prompts for a real chat model, and model.path=tiny is "
            f"warmed up only on {tiny}: set model.path (e.g. smollm2-135m-instruct) or another data.task"
        )


@rule("model.tiny.num_kv_heads")
def tiny_heads_divide(cfg):
    t = cfg.model.tiny
    if "tiny" in (cfg.model.path, cfg.reward.model.path) and t.num_heads % t.num_kv_heads:
        return (
            f"model.tiny.num_kv_heads={t.num_kv_heads} does not divide model.tiny.num_heads={t.num_heads} (each "
            "key/value head serves the same number of query heads): change one of them, e.g. "
            f"model.tiny.num_heads={t.num_kv_heads * max(1, round(t.num_heads / t.num_kv_heads))}"
        )


@rule("model.tiny.hidden_size")
def tiny_head_size(cfg):
    """Rotary embeddings turn pairs of a head's dimensions: a head size that is not a whole, even number
    failed in the first forward (the fifteenth catalogue's t05)."""
    t = cfg.model.tiny
    head = t.hidden_size / t.num_heads
    if "tiny" in (cfg.model.path, cfg.reward.model.path) and (head != int(head) or int(head) % 2):
        fit = t.num_heads * max(2, 2 * round(head / 2))
        return (
            f"model.tiny.num_heads={t.num_heads} splits model.tiny.hidden_size={t.hidden_size} into heads of {head:g}: "
            f"rotary embeddings need a whole, even head size; e.g. model.tiny.hidden_size={fit}"
        )


@rule("model.tiny.max_position")
def tiny_positions(cfg):
    p, r, positions = cfg.data.max_prompt_length, cfg.rollout.max_response_length, cfg.model.tiny.max_position
    if cfg.model.path == "tiny" and p + r > positions:  # before the model is built and warmed up
        return (
            f"data.max_prompt_length={p} + rollout.max_response_length={r} = {p + r} tokens, more than "
            f"model.tiny.max_position={positions}: set model.tiny.max_position={p + r} or more, or lower one of them"
        )


@rule("env.name")
def environment_exists(cfg):
    from rlpost.envs import ENVS, PARSERS

    name = cfg.env.name
    if not name:
        return None
    if ":" in name:  # a user's file: imported where the episodes run, checked here as far as it can be
        path = Path(name.rpartition(":")[0]).expanduser()
        return None if path.is_file() else f"env.name={name!r}: no file {path}"
    if name not in ENVS:
        return ENVS.unknown(name)
    if cfg.env.tool_parser not in PARSERS:
        return f"with env.name={name!r}: {PARSERS.unknown(cfg.env.tool_parser)}"


@rule("run.overwrite")
def overwrite_or_resume(cfg):
    if cfg.run.overwrite and cfg.trainer.resume != "none":
        return (
            f"run.overwrite=true deletes the run in run.dir, trainer.resume={cfg.trainer.resume} goes on with it: "
            "choose one"
        )


@rule("trainer.resume")
def resume_folder_exists(cfg):
    if cfg.trainer.resume not in ("none", "auto") and not Path(cfg.trainer.resume).expanduser().is_dir():
        return f"trainer.resume={cfg.trainer.resume!r}: not `none`, `auto` or an existing folder"


@rule("model.path")
def model_folder_exists(cfg):
    if not cfg.model.path.strip():  # read as the current folder (the eleventh catalogue's t53)
        return "model.path is empty: give a model folder, a hub id, a .gguf file or `tiny`"
    return missing_folder("model.path", cfg.model.path)


@rule("critic.model_path")
def critic_folder_exists(cfg):
    if cfg.critic.model_path == "tiny":  # (the fifteenth catalogue's t59: looked up on the hub)
        return "critic.model_path=tiny: leave it empty to start the critic from the policy's weights (model.path)"
    return missing_folder("critic.model_path", cfg.critic.model_path)


@rule("reward.model.path")
def reward_model_folder_exists(cfg):
    return missing_folder("reward.model.path", cfg.reward.model.path)


@rule("trainer.param_offload")
def one_parameter_offload(cfg):
    if cfg.trainer.param_offload and cfg.trainer.optim.offload == "cpu":
        return (
            "trainer.param_offload=true with trainer.optim.offload=cpu: FSDP's CPU offload already keeps the "
            "parameters on the CPU; set one of them"
        )


@rule("rollout.num_workers")
def colocated_actor_per_rank(cfg):
    r = cfg.rollout
    if Colocation.of(cfg).colocated and r.num_workers * r.tensor_parallel_size > cfg.trainer.world_size:
        shards = f" x rollout.tensor_parallel_size={r.tensor_parallel_size}" if r.tensor_parallel_size > 1 else ""
        return (
            f"cluster.placement=colocate shares each trainer rank's device with one rollout shard: "
            f"rollout.num_workers={r.num_workers}{shards} must be <= trainer.world_size="
            f"{cfg.trainer.world_size} (or use cluster.placement=split)"
        )


@rule("rollout.tensor_parallel_size")
def tensor_parallel_engines(cfg):
    r = cfg.rollout
    if r.tensor_parallel_size == 1:
        return None
    if r.backend != "vllm":
        return f"rollout.tensor_parallel_size={r.tensor_parallel_size} splits a vLLM engine; set rollout.backend=vllm"
    if cfg.model.lora.rank > 0 and cfg.model.lora.mode == "adapter":
        return (
            f"rollout.tensor_parallel_size={r.tensor_parallel_size} with model.lora.mode=adapter: the adapter sync "
            "writes a peft folder in one process; use model.lora.mode=merge"
        )
    if Colocation.of(cfg).on_gpus and not r.enforce_eager:  # on H200s, colocated and split: docs/multinode.md
        return (
            f"rollout.tensor_parallel_size={r.tensor_parallel_size} on GPUs: vLLM's compiled model failed its first "
            "forward in cuBLAS (cublasCreate), colocated and split, and ran eager; set rollout.enforce_eager=true"
        )


@rule("algo.async_rollouts")
def async_rollouts_need_split(cfg):
    from rlpost.algos.algorithms import ALGORITHMS

    if not cfg.algo.async_rollouts:
        return None
    if cfg.cluster.placement != "split":
        return "algo.async_rollouts=true needs cluster.placement=split (the rollouts generate while the trainer trains)"
    if ALGORITHMS.get(cfg.algo.name).batch_filter != "none":
        return (
            f"algo.async_rollouts=true with algo.name={cfg.algo.name}: its batch filter (dynamic sampling) "
            "works on whole generated batches; use algo.async_rollouts=false"
        )
    if cfg.rollout.backend == "vllm" and cfg.model.lora.rank > 0 and cfg.model.lora.mode == "adapter":
        return (
            "algo.async_rollouts=true with model.lora.mode=adapter on vLLM: a request keeps the adapter it "
            "started with, so a generation a sync lands in would not use the new one; use model.lora.mode=merge"
        )


@rule("optim.betas")  # the trainer's and the critic's (the ninth catalogue's n27: the critic's, unchecked, failed late)
def adam_betas(cfg):
    for section in ("trainer", "critic"):
        betas = list(getattr(cfg, section).optim.betas)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            return f"{section}.optim.betas={betas} must be two numbers in [0, 1)"


@rule("logger.backends")
def known_trackers(cfg):
    from rlpost.metrics.trackers import TRACKERS

    unknown = [b for b in cfg.logger.backends if b not in TRACKERS]
    if unknown:
        return TRACKERS.unknown(unknown[0])


@rule("algo.kl_target")
def kl_target_acts(cfg):
    from rlpost.algos.algorithms import ALGORITHMS

    a = cfg.algo
    if a.kl_target > 0 and (a.kl_coef <= 0 or ALGORITHMS.get(a.name).kl != "reward"):
        return (
            f"algo.kl_target={a.kl_target:g} adapts the KL coefficient only where the KL is a reward penalty (PPO, "
            f"REINFORCE++) with algo.kl_coef > 0; algo.name={a.name} with algo.kl_coef={a.kl_coef:g} ignores it: "
            "set algo.kl_target=0"
        )


@rule("algo.clip_ratio_low")
def clip_low_read(cfg):
    """CISPO's loss caps its importance weight from above only: a lower bound set for it is not read."""
    from rlpost.algos.algorithms import ALGORITHMS

    a = cfg.algo
    if ALGORITHMS.get(a.name).policy_loss == "cispo" and a.clip_ratio_low != 0.2:
        return (
            f"algo.clip_ratio_low={a.clip_ratio_low:g} is not read by algo.name={a.name}: its loss caps the importance "
            "weight at 1 + algo.clip_ratio_high only; leave algo.clip_ratio_low out"
        )


@rule("model.lora.target_modules")
def lora_targets(cfg):
    targets = list(cfg.model.lora.target_modules)
    if cfg.model.lora.rank > 0 and not targets:
        return "model.lora.target_modules is empty; e.g. [all-linear] or [q_proj, v_proj]"
    if cfg.model.lora.rank > 0 and "all-linear" in targets and len(targets) > 1:
        return f"model.lora.target_modules={targets}: `all-linear` stands alone"
    if cfg.model.lora.rank == 0 and targets != ["all-linear"]:  # set, but LoRA is off: a full fine-tune
        return f"model.lora.target_modules={targets} is set but model.lora.rank=0 (LoRA off): set model.lora.rank"


@rule("model.lora.rank")
def vllm_adapter_rank(cfg):
    lora = cfg.model.lora
    if lora.mode == "adapter" and cfg.rollout.backend == "vllm" and lora.rank > 512:
        return f"model.lora.rank={lora.rank}: vLLM serves adapters of rank <= 512; use model.lora.mode=merge"


@rule("algo.overlong_buffer")
def overlong_buffer_fits(cfg):
    buffer, limit = cfg.algo.overlong_buffer, cfg.rollout.max_response_length
    if buffer >= limit:
        return (
            f"algo.overlong_buffer={buffer} must be shorter than rollout.max_response_length={limit}: "
            "the penalty ramps over the last tokens before the limit"
        )


@rule("reward.model.score_fn")
def reward_model_scorer(cfg):
    m = cfg.reward.model
    if m.kind == "causal_lm" and m.path and ".py:" not in m.score_fn:
        return (
            f"reward.model.kind=causal_lm needs reward.model.score_fn=path/to/file.py:function (got "
            f"{m.score_fn!r}): the function that turns the model into one score per sample"
        )
    if m.score_fn and m.kind != "causal_lm":
        return f"reward.model.score_fn={m.score_fn!r} is for reward.model.kind=causal_lm (kind is {m.kind!r})"


@rule("reward.rule_weight")
def something_scores(cfg):
    weighed = cfg.reward.model.path and cfg.reward.model.weight
    if cfg.reward.rule_weight == 0 and not weighed:
        return (
            "reward.rule_weight=0 and no weighted reward model (reward.model.path, reward.model.weight): "
            "every sample would score 0"
        )
    if cfg.reward.rule_weight < 0 and not weighed:  # (the seventeenth catalogue's t118: trained to be wrong)
        return (
            f"reward.rule_weight={cfg.reward.rule_weight:g} and no weighted reward model: the run would be rewarded "
            "for wrong answers; give a positive weight (a negative one weighs the rule against a reward model)"
        )


GROUP_ADVANTAGES = {"grpo", "rloo", "reinforce_pp_baseline"}  # a sample against the others of its prompt


@rule("rollout.n")
def groups_to_compare(cfg):
    from rlpost.algos.algorithms import ALGORITHMS

    advantage = ALGORITHMS.get(cfg.algo.name).advantage
    if advantage in GROUP_ADVANTAGES and cfg.rollout.n < 2:
        return (
            f"algo.name={cfg.algo.name} needs rollout.n >= 2 (got {cfg.rollout.n}): it scores each sample against "
            f"the other samples of its prompt (advantage {advantage!r}); with one a prompt every advantage is 0 "
            "and nothing trains (8 is usual)"
        )


def validate(cfg: TrainConfig, this_machine: bool = True) -> None:
    """Every key's allowed values (`choices`, ranges: declared with the key), then the rules that
    span keys (`RULES`; those about this machine only with `this_machine`: `rlpost plan` sizes a
    GPU run on a laptop). Raises ConfigError naming the key at fault and what would fix it."""
    check_values(cfg)
    for r in RULES:
        if r.this_machine and not this_machine:
            continue
        problem = r.check(cfg)
        if problem:
            raise ConfigError(problem)


def check_values(cfg: TrainConfig, prefix: str = "") -> None:
    """Every key's (under `prefix`, e.g. `data.`) allowed values: its `choices` or its range."""
    for key, f in iter_fields():
        if not key.startswith(prefix):
            continue
        value = _get(cfg, key)
        choices = f.metadata.get("choices")
        if isinstance(choices, Registry) and value not in choices:  # its message suggests the closest name
            raise ConfigError(choices.unknown(value))
        if choices is not None and value not in choices:
            raise ConfigError(f"{key}={value!r} is not allowed; choose one of {list(choices)}")
        if isinstance(value, float) and not math.isfinite(value):  # nan passes every range test
            raise ConfigError(f"{key}={value!r} must be a finite number")
        broken = _out_of_range(value, f.metadata["range"]) if "range" in f.metadata else None
        if broken:
            raise ConfigError(f"{key}={value!r} must be {broken}")


from rlpost.config import rules_algo, rules_batch, rules_machine, rules_mode  # noqa: E402, F401  (their rules join RULES)
