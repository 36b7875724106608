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

from dataclasses import replace

from rlpost.config import Colocation, ConfigError, TrainConfig
from rlpost.controller.model_shape import ModelShape, model_shape, shape_of  # noqa: F401 (plan's callers read them here)
from rlpost.controller.step import old_logprobs_in_update
from rlpost.trainer.logprobs import resolve_layout

GIB = 2**30
CONTEXT_GIB = 1.0  # the CUDA context, NCCL's buffers and the allocator's slack, per process
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


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
    if t.max_tokens_per_microbatch:  # a longer sequence goes alone in its micro-batch (the 18th catalogue's t38)
        return max(t.max_tokens_per_microbatch, longest)
    return t.micro_batch_size * longest


def dense_mask_bytes(cfg: TrainConfig, tokens: int, dtype_bytes: int) -> float:
    """Packed rows without a varlen kernel (sdpa, eager): transformers builds a dense [T, T]
    block-diagonal mask over the micro-batch's T tokens, and its additive form in the compute dtype
    (the 18th catalogue's t06: not counted, the plan offered 262144-token micro-batches)."""
    attn = cfg.model.attn_implementation
    packed = resolve_layout(cfg.trainer.layout, attn, cfg.trainer.device) == "packed"
    varlen = attn.startswith("flash_attention") or attn == "rlpost_varlen"
    return float(tokens) ** 2 * (1 + dtype_bytes) if packed and not varlen else 0.0


def side_models(cfg: TrainConfig, shape: ModelShape) -> dict[str, float]:
    """What the critic and the reward model keep on each trainer GPU, which they share with the
    actor (`placement.py`; the 18th catalogue's t37): the critic its float32 shards, gradients and
    (not offloaded) Adam's moments; the reward model a whole copy in the compute dtype."""
    from rlpost.algos.algorithms import ALGORITHMS

    w = cfg.trainer.world_size
    out = {"critic": 0.0, "reward_model": 0.0}
    if "critic" in ALGORITHMS.get(cfg.algo.name).roles:
        c = shape_of(cfg, cfg.critic.model_path) if cfg.critic.model_path else shape
        out["critic"] = (8 + (8 if cfg.critic.optim.offload == "none" else 0)) * c.params / w
    if cfg.reward.model.path:
        r = shape_of(cfg, cfg.reward.model.path) if cfg.reward.model.path != cfg.model.path else shape
        out["reward_model"] = DTYPE_BYTES[cfg.model.dtype] * r.params
    return out


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
        "activations": tokens * shape.layers * shape.activation_bytes_per_token(b) + dense_mask_bytes(cfg, tokens, b),
        "logits": logit_tokens(cfg, tokens) * shape.vocab * (b + 5 * 4),
        **side_models(cfg, shape),
    }
    if o.offload == "cpu":  # FSDP's CPU offload: weights and gradients live on the host too
        parts["weights"] = parts["gradients"] = 0.0
    if cfg.trainer.param_offload and not old_logprobs_in_update(cfg):
        parts["reference"] = 0.0  # on the device for its own pass only, not in the update's
    others = parts["critic"] + parts["reward_model"]
    resident = (0.0 if cfg.trainer.param_offload else parts["weights"] + parts["reference"]) + (
        adam if o.offload == "none" else 0.0
    )
    resident += others
    kept = parts["weights"] + parts["reference"] + parts["gradients"] + (adam if o.offload == "none" else 0.0) + others
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
    "critic": "trainer.world_size (more ranks) or critic.optim.offload",
    "reward_model": "a smaller reward model (reward.model.path: a whole copy a trainer GPU)",
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
                fixed_parts = ("weights", "reference", "adam", "gradients", "gathered", "critic", "reward_model")
                largest = max(fixed_parts, key=lambda part: t[part])
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
