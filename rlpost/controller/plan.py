"""The memory plan: what each GPU of a run will hold at its peak, from the model's shape and the
settings, before anything starts (`rlpost plan`, and the check at start-up).

A trainer rank (FSDP2 over `trainer.world_size` ranks, float32 master weights, `model.dtype` for
compute) holds between phases its shard of the weights, of the frozen reference (KL, stored in
`model.dtype`) and of Adam's two moments (`trainer.optim.offload=none`); `trainer.param_offload`
moves the weight shards to the host between phases (the reference comes to the update only when
the update scores it: one optimizer step a batch), `layerwise` keeps only two FSDP units' moments
on the GPU, during the optimizer step alone (after the backward has let go of its activations),
`cpu` all of them on the host. During the update it adds the gradient shards, two gathered
decoder layers (the one computing and the one prefetched) and the gathered root (embeddings, LM
head) in the compute dtype, one unsharded float32 gradient unit, and the activations of one
micro-batch: per token, each decoder layer's saved tensors, and the logits of the tokens that
have them (`logit_tokens`), in the compute dtype, then five float32 tensors of their size (the
cast, the temperature's division, the log-softmax, the entropy's two): fitted on 2 x H200, where
the measured update peak was 91.5 GiB for a 3B shape colocated and 129.4 GiB for a 7B one
offloaded, and then checked on a 3B split run: plan 119.9 GiB, measured 120.2;
`benchmarks/gpu_session.sh` Q, R, S and `scripts/plan_vs_measured.py`). A vLLM engine takes
`rollout.gpu_memory_utilization` of its GPU while awake (weights, KV cache, activations) and about
nothing while asleep (colocated, during the trainer's phases).

Colocated, a GPU's peak is the larger of (the trainer's update + the engine asleep) and (the
trainer's resident memory + the engine awake); split, the trainer's GPUs and the engines' are
separate. The numbers are the allocator's (torch's `max_memory_allocated`): the CUDA context and
the allocator's fragmentation come on top (`CONTEXT_GIB`, checked with a margin).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from rlpost.config import Colocation, ConfigError, TrainConfig
from rlpost.controller.step import old_logprobs_in_update
from rlpost.trainer.logprobs import resolve_layout

GIB = 2**30
CONTEXT_GIB = 1.0  # the CUDA context, NCCL's buffers and the allocator's slack, per process
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    tied: bool

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of a decoder layer."""
        h, kv, i = self.hidden, self.kv_width, self.intermediate
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def layer_params(self) -> int:
        linear = sum(a * b for a, b in self.module_shapes().values())
        return linear + self.hidden + 2 * self.kv_width + 2 * self.hidden  # q/k/v biases, two norms

    @property
    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def lora_params(self, rank: int, targets: list) -> int:
        names = LORA_MODULES if "all-linear" in targets else [m for m in LORA_MODULES if m in targets]
        return self.layers * sum(rank * (a + b) for m, (a, b) in self.module_shapes().items() if m in names)

    def activation_bytes_per_token(self, dtype_bytes: int) -> int:
        """What one decoder layer keeps for the backward pass, per token: the inputs of its
        linear layers and attention (6 h + 2 kv in the compute dtype), the MLP's 4 products, and
        the two norms' float32 inputs."""
        h = self.hidden
        return dtype_bytes * (6 * h + 2 * self.kv_width + 4 * self.intermediate) + 2 * 4 * h


def hub_config(repo_id: str) -> str:
    """A hub id's config.json in the Hugging Face cache ("": not a hub id); not cached, an error that says
    so: `check_hub_reachable`'s (offline, or no network), else that the plan downloads nothing (the
    sixteenth catalogue's t101: "no config.json there" read as if a folder existed)."""
    from huggingface_hub import try_to_load_from_cache

    from rlpost.models.loading import check_hub_reachable

    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a hub id
        return ""
    if isinstance(cached, str):
        return cached
    check_hub_reachable(repo_id)
    raise FileNotFoundError(
        f"model.path={repo_id!r} is not in the Hugging Face cache: the memory plan reads the model's config.json "
        f"and downloads nothing; `huggingface-cli download {repo_id} config.json` fills the cache"
    )


def model_shape(path: str) -> ModelShape:
    """The shape of the model in the local folder `path` (its `config.json`)."""
    file = Path(path).expanduser() / "config.json"
    if not file.is_file() and not Path(path).expanduser().exists():  # a hub id: its config in the cache
        file = Path(hub_config(path))
    if not file.is_file():
        raise FileNotFoundError(f"model.path={path!r}: no config.json there; the memory plan needs the model's folder")
    c = json.loads(file.read_text())
    c = c.get("text_config", c)
    try:
        return ModelShape(
            hidden=c["hidden_size"],
            layers=c["num_hidden_layers"],
            intermediate=c["intermediate_size"],
            vocab=c["vocab_size"],
            heads=c["num_attention_heads"],
            kv_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
            tied=bool(c.get("tie_word_embeddings", False)),
        )
    except KeyError as e:
        raise ValueError(f"{file}: no {e} (the memory plan reads decoder-only transformer configs)") from None


def shape_of(cfg: TrainConfig, path: str | None = None) -> ModelShape:
    """The policy's shape: `model.tiny` for the tiny model, else the config.json of the local
    folder `path` (default `model.path`)."""
    path = path or cfg.model.path
    if path == "tiny":
        from rlpost.tiny.model import build_char_tokenizer

        t = cfg.model.tiny
        vocab = len(build_char_tokenizer())
        return ModelShape(t.hidden_size, t.num_layers, t.intermediate_size, vocab, t.num_heads, t.num_kv_heads, True)
    return model_shape(path)


def lora_rank_refusal(rank: int, where: str, hidden: int | None) -> str | None:
    """A LoRA rank above the model's hidden size, said (`train` and `plan` refuse it: the twelfth
    catalogue's t14 ran out of memory in Ray after 144 s; the thirteenth's n27 planned it)."""
    if not (hidden and rank > hidden):
        return None
    return (
        f"model.lora.rank={rank} is above {where}'s hidden size ({hidden}): the adapters would be larger than the "
        "layers they adapt; give a rank below it (8-64 are usual)"
    )


def micro_batch_tokens(cfg: TrainConfig) -> int:
    """The most tokens one micro-batch can hold: the token budget, or full-length rows."""
    t = cfg.trainer
    longest = cfg.data.max_prompt_length + cfg.rollout.max_response_length
    return t.max_tokens_per_microbatch or t.micro_batch_size * longest


def logit_tokens(cfg: TrainConfig, tokens: int) -> float:
    """The most tokens of a micro-batch of `tokens` whose logits are computed. The log-probs pass
    `logits_to_keep`, so no prompt position reaches the LM head (`trainer/logprobs.py`): a
    micro-batch of rows holds at most a full response per row, the responses' share of full-length
    rows; a token budget of packed rows (short prompts) may be nearly all response tokens. Measured
    on SmolLM2 (49k vocabulary, padded: 46-token prompts, 128 rows) on an H200: 34.2 GiB at
    128-token responses, 9.7 at 14 (`benchmarks/multi_gpu/scale_h200x4.json`)."""
    packed = resolve_layout(cfg.trainer.layout, cfg.model.attn_implementation, cfg.trainer.device) == "packed"
    if packed and cfg.trainer.max_tokens_per_microbatch:
        return float(tokens)
    r = cfg.rollout.max_response_length
    return tokens * r / (cfg.data.max_prompt_length + r)


def trainer_plan(cfg: TrainConfig, shape: ModelShape) -> dict[str, float]:
    """Bytes of each part of a trainer rank's memory at its peak (the update), `peak` (what is there
    at once), `fixed` (the peak of a micro-batch of no tokens) and `resident`: what stays between phases."""
    w, o = cfg.trainer.world_size, cfg.trainer.optim
    b = DTYPE_BYTES[cfg.model.dtype]
    lora = cfg.model.lora.rank > 0
    trainable = shape.lora_params(cfg.model.lora.rank, cfg.model.lora.target_modules) if lora else shape.params
    master = 4 * (shape.params + (trainable if lora else 0)) / w
    reference = b * shape.params / w if cfg.algo.kl_coef > 0 and not lora else 0.0  # stored in the compute dtype
    if o.offload == "none":
        adam = 2 * 4 * trainable / w
    elif o.offload == "layerwise":  # two units' moments in flight (one stepping, one arriving)
        unit = max(shape.layer_params, shape.root_params) * (trainable / shape.params)
        adam = 2 * 2 * 4 * unit / w
    else:
        adam = 0.0
    tokens = micro_batch_tokens(cfg)
    parts = {
        "weights": master,
        "reference": reference,
        "adam": adam,
        "gradients": 4 * trainable / w,
        "gathered": b * (2 * shape.layer_params + shape.root_params) + 4 * (shape.layer_params if not lora else 0),
        "activations": tokens * shape.layers * shape.activation_bytes_per_token(b),
        "logits": logit_tokens(cfg, tokens) * shape.vocab * (b + 5 * 4),
    }
    if o.offload == "cpu":  # FSDP's CPU offload: weights and gradients live on the host too
        parts["weights"] = parts["gradients"] = 0.0
    if cfg.trainer.param_offload and not old_logprobs_in_update(cfg):
        parts["reference"] = 0.0  # on the device for its own pass only, not in the update's
    resident = (0.0 if cfg.trainer.param_offload else parts["weights"] + parts["reference"]) + (
        adam if o.offload == "none" else 0.0
    )
    kept = parts["weights"] + parts["reference"] + parts["gradients"] + (adam if o.offload == "none" else 0.0)
    passes = parts["gathered"] + parts["activations"] + parts["logits"]  # forward and backward
    # layerwise: the moments' device slots exist during the optimizer step only, after the backward
    apart = o.offload == "layerwise"
    peak = kept + (max(passes, adam) if apart else passes)
    fixed = kept + (max(parts["gathered"], adam) if apart else parts["gathered"])  # at no tokens
    return {**parts, "peak": peak, "fixed": fixed, "resident": resident, "slots_apart": float(apart)}


def gpu_plan(cfg: TrainConfig, shape: ModelShape, gpu_bytes: float) -> dict:
    """The plan of every kind of GPU of the run: `trainer` (its parts), `rollout` (awake), and
    `gpus`: for each kind of GPU (colocated: one; split: trainer and rollout) its peak."""
    trainer = trainer_plan(cfg, shape)
    awake = cfg.rollout.gpu_memory_utilization * gpu_bytes if cfg.rollout.backend == "vllm" else 0.0
    if Colocation.of(cfg).colocated:
        gpus = {"colocated": max(trainer["peak"], trainer["resident"] + awake)}
    else:
        gpus = {"trainer": trainer["peak"], "rollout": awake}
    return {"trainer": trainer, "rollout_awake": awake, "gpus": gpus, "gpu_bytes": gpu_bytes, "shape": shape}


# the knob that shrinks each part, for the error that refuses a plan
KNOBS = {
    "weights": "trainer.world_size (more ranks) or trainer.param_offload=true (between phases)",
    "reference": "trainer.world_size (more ranks), or algo.kl_coef=0 (no reference)",
    "adam": "trainer.optim.offload=layerwise",
    "gradients": "trainer.world_size (more ranks) or model.lora.rank",
    "activations": "trainer.micro_batch_size or trainer.max_tokens_per_microbatch",
    "logits": "trainer.micro_batch_size or trainer.max_tokens_per_microbatch",
    "gathered": "a smaller model (the gathered layers do not shard)",
}


def check_plan(cfg: TrainConfig, plan: dict, log=print) -> None:
    """Refuse a run whose plan cannot fit its GPUs whatever its data, naming the knob that frees
    the most; warn when only the worst case of the activations (micro-batches filled to
    `micro_batch_tokens`, every row at full length) does not fit."""
    t, shape = cfg.rollout.tensor_parallel_size, plan["shape"]
    if shape.heads % t or (shape.kv_heads % t and t % shape.kv_heads):
        raise ConfigError(
            f"rollout.tensor_parallel_size={t}: vLLM splits the model's {shape.heads} attention heads "
            f"({shape.kv_heads} key/value heads) evenly over the shards; choose a size that divides "
            f"{shape.heads} (and divides or is a multiple of {shape.kv_heads})"
        )
    room = plan["gpu_bytes"] - CONTEXT_GIB * GIB * (2 if Colocation.of(cfg).colocated else 1)
    if room <= 0:  # (the knob advice below would be about nothing)
        raise ConfigError(
            f"a GPU of {plan['gpu_bytes'] / GIB:.3g} GiB (`rlpost plan --gpu-gb`, or the GPU found) does not hold even "
            f"the CUDA contexts ({plan['gpu_bytes'] / GIB - room / GIB:.3g} GiB): give the GPU's memory in GiB"
        )
    t = plan["trainer"]
    fixed = t["fixed"]
    for kind, peak in plan["gpus"].items():
        awake = plan["rollout_awake"] if kind != "trainer" else 0.0
        need = max(fixed if kind != "rollout" else 0.0, (t["resident"] if kind != "rollout" else 0.0) + awake)
        where = f"a {kind} GPU needs at least {need / GIB:.1f} GiB of {plan['gpu_bytes'] / GIB:.1f} GiB"
        if need > room:
            if awake and (t["resident"] if kind != "rollout" else 0.0) + awake >= fixed:
                knob = (
                    f"rollout.gpu_memory_utilization (now {cfg.rollout.gpu_memory_utilization}) or the trainer's "
                    f"memory between phases ({t['resident'] / GIB:.1f} GiB: trainer.param_offload=true, "
                    "trainer.optim.offload=layerwise)"
                )
            else:
                largest = max(("weights", "reference", "adam", "gradients", "gathered"), key=lambda part: t[part])
                knob = f"{KNOBS[largest]} (the largest part: {largest}, {t[largest] / GIB:.1f} GiB)"
            raise ConfigError(
                f"the memory plan does not fit: {where} ({room / GIB:.1f} GiB after the CUDA contexts); "
                f"change {knob}. `rlpost plan` prints the whole plan."
            )
        if kind != "rollout" and peak > room:
            log(
                f"memory plan: a {kind} GPU may need up to {peak / GIB:.1f} GiB of {plan['gpu_bytes'] / GIB:.1f} GiB "
                f"with micro-batches of {micro_batch_tokens(cfg)} tokens at full length (activations "
                f"{t['activations'] / GIB:.1f}, logits {t['logits'] / GIB:.1f} GiB); if the update runs out of "
                f"memory, lower {KNOBS['activations']}"
            )


def largest_token_budget(cfg: TrainConfig, shape: ModelShape, gpu_bytes: float, step: int = 1024) -> int:
    """The largest `trainer.max_tokens_per_microbatch` (a multiple of `step`, up to 256 of them) whose
    plan fits a trainer rank's GPU, or 0 if not even `step` tokens do.
    The update pays a fixed cost per micro-batch (kernel launches, FSDP's copies: a 0.5B update
    was 2.4x faster at 16384 tokens than at 4096, `benchmarks/multi_gpu/profile_0.5b_h200.json`)."""
    room = gpu_bytes - CONTEXT_GIB * GIB * (2 if Colocation.of(cfg).colocated else 1)

    def fits(tokens: int) -> bool:
        trainer = replace(cfg.trainer, max_tokens_per_microbatch=tokens)
        plan = gpu_plan(replace(cfg, trainer=trainer), shape, gpu_bytes)
        return max(peak for kind, peak in plan["gpus"].items() if kind != "rollout") <= room

    low, high = 0, 256  # in units of `step`: fits(low * step) holds (or low is 0), fits(high * step) is not known
    if fits(high * step):
        return high * step
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * step) else (low, mid)
    return low * step


def gpu_size(given: float | None) -> tuple[float, bool]:
    """(GiB of the GPU the plan is for, whether it is assumed): `--gpu-gb`, else this machine's GPU,
    else 80 GiB (an H100's), assumed."""
    if given is not None:
        return given, False
    import torch

    return (torch.cuda.mem_get_info()[1] / GIB, False) if torch.cuda.is_available() else (80.0, True)


def plan_header(cfg: TrainConfig, shape: ModelShape, gpu_gb: float, assumed: bool) -> str:
    """The model's size, and what the plan stands for where the run uses no GPU or none is here (the
    fifteenth catalogue's t12: a CPU run's config planned for 80 GiB GPUs without a word)."""
    n = shape.params
    lines = [f"model: {f'{n / 1e9:.2f}B' if n >= 1e9 else f'{n / 1e6:.1f}M'} parameters, {shape.layers} layers, "
             f"hidden {shape.hidden}"]  # fmt: skip
    if cfg.trainer.device != "cuda":
        lines.append(
            f"trainer.device={cfg.trainer.device}: this run uses no GPU; below is what the same config would hold "
            "on GPUs (trainer.device=cuda)"
        )
    if assumed:
        lines.append(f"no GPU here: one of {gpu_gb:g} GiB is assumed (rlpost plan --gpu-gb N for another)")
    return "\n".join(lines)


def format_plan(plan: dict) -> str:
    t = plan["trainer"]
    lines = [f"memory plan per GPU ({plan['gpu_bytes'] / GIB:.0f} GiB), GiB:"]
    lines.append(
        "  trainer rank at its peak (the update): "
        + ", ".join(f"{part} {t[part] / GIB:.2f}" for part in KNOBS if t[part] > 0)
        + (
            f"; at once {t['peak'] / GIB:.2f} (Adam's layerwise slots in the optimizer step, after the passes)"
            if t["slots_apart"]
            else f" = {t['peak'] / GIB:.2f}"
        )
        + f"; between phases {t['resident'] / GIB:.2f}"
    )
    if plan["rollout_awake"]:
        lines.append(f"  vLLM engine awake: {plan['rollout_awake'] / GIB:.2f} (rollout.gpu_memory_utilization)")
    for kind, peak in plan["gpus"].items():
        lines.append(f"  {kind} GPU peak: {peak / GIB:.2f} (+{CONTEXT_GIB:.0f} per process: CUDA context)")
    return "\n".join(lines)
