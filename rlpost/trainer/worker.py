"""The trainer rank: an FSDP2-sharded policy (and frozen reference), log-probs and PPO updates.

With LoRA (`model.lora.rank > 0`) peft wraps the policy before FSDP2 shards it; only the adapter is
trainable, optimized and checkpointed, and the reference of the KL loss is the policy itself with
its adapters disabled (the frozen base), not a second model. What a weight sync carries is its
`kind` (`rlpost.trainer.lora.SYNC_KINDS`): the plain weights, the merged ones, the base, or the adapter alone.

A plain class: the controller wraps it in a Ray actor, tests call it directly. Every method that
runs collectives must be called on all ranks of the trainer group at once.

Loss normalisation across data-parallel ranks: FSDP averages gradients over ranks, so each rank
scales its loss by world_size and divides by the *global* token (or sequence) count of the
mini-batch. Micro-batches and ranks then add up to exactly the full mini-batch loss.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from rlpost.algos.losses import aggregate, kl_penalty, ppo_clip_loss, truncated_is_weights
from rlpost.config import TrainConfig, mini_batch_size
from rlpost.data.batch import Batch
from rlpost.data.microbatch import split_shard
from rlpost.models.loading import DTYPES, load_causal_lm
from rlpost.models.tiny import cosine
from rlpost.trainer.fsdp import fsdp_units, full_tensor, params_on, shard_model
from rlpost.trainer.logprobs import response_logprobs
from rlpost.trainer.lora import (ADAPTER_DTYPE, adapter_named_parameters, adapter_weights, apply_lora,
                                 base_named_parameters, base_weights, merged_weights, save_adapter,
                                 sync_kinds)
from rlpost.trainer.optim import LayerwiseAdamW
from rlpost.weightsync.manifest import checksum, spec_of
from rlpost.weightsync.sync import send_weights
from rlpost.weightsync.transport import SyncGroup, stacks_if_stuck


class TrainerWorker:
    def __init__(self, cfg: TrainConfig, model_path: str, rank: int, world_size: int,
                 master_addr: str, master_port: int):
        torch.set_num_threads(cfg.cluster.num_threads)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        if cfg.trainer.device == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
            backend = "nccl"
        else:
            self.device, backend = torch.device("cpu"), "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}",
                                    rank=rank, world_size=world_size)
        torch.manual_seed(cfg.run.seed)
        self.compute_dtype = DTYPES[cfg.model.dtype]
        m = cfg.model
        # master weights in float32; FSDP casts to the compute dtype for forward/backward
        o = cfg.trainer.optim
        self.model_path = model_path
        self.lora = m.lora if m.lora.rank > 0 else None
        model = load_causal_lm(model_path, "float32", m.attn_implementation, m.trust_remote_code)
        if self.lora is not None:  # before sharding: FSDP2 shards each adapter with its layer
            model = apply_lora(model, self.lora)
        self.model = shard_model(model, self.device, self.compute_dtype, cpu_offload=o.offload == "cpu")
        self.model.train()
        self.optimizer = build_optimizer(self.model, o)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, partial(lr_factor, o, total_optimizer_steps(cfg)))
        self.ref_model = None  # with LoRA the reference is self.model with its adapters disabled
        if cfg.algo.kl_coef > 0 and self.lora is None:
            ref = load_causal_lm(model_path, "float32", m.attn_implementation, m.trust_remote_code)
            self.ref_model = shard_model(ref, self.device, self.compute_dtype).eval().requires_grad_(False)
        self.packed = use_packed_layout(cfg.trainer.layout, m.attn_implementation)
        self.sync_group: SyncGroup | None = None
        self.manifests = self._manifests()
        if cfg.trainer.param_offload:  # shards live on the CPU between phases
            for model in (self.model, self.ref_model):
                if model is not None:
                    model.to("cpu")

    def _manifests(self) -> dict:
        """The manifest of each sync kind this run sends."""
        def meta(named, dtype):
            return [spec_of(n, full_tensor_meta(p, dtype)) for n, p in named]

        if self.lora is None:
            return {"full": meta(self.model.named_parameters(), self.compute_dtype)}
        base = meta(base_named_parameters(self.model), self.compute_dtype)
        if self.lora.mode == "merge":
            return {"merged": base}
        return {"base": base, "adapter": meta(adapter_named_parameters(self.model), ADAPTER_DTYPE)}

    @property
    def manifest(self):
        """The manifest of the sync that carries the whole model (a rollout's first sync)."""
        return self.manifests[sync_kinds(self.cfg, first=True)[0]]

    @contextmanager
    def _resident(self, *models, keep: bool = False):
        """With `trainer.param_offload`, the shards of `models` (default: policy and reference)
        come to the device for one phase and go back afterwards unless `keep`."""
        with ExitStack() as stack:
            if self.cfg.trainer.param_offload:
                for model in models or (self.model, self.ref_model):
                    if model is not None:
                        stack.enter_context(params_on(model, self.device, keep=keep))
            yield

    # ------------------------------------------------------------------------------ log-probs
    def _logprobs(self, model, mb: Batch, with_entropy: bool):
        """Per-token log-probs [b, R] of the response tokens (and entropy [b, R])."""
        return response_logprobs(model, mb, self.cfg.rollout.temperature, self.packed, with_entropy)

    def _ref_logprobs(self, mb: Batch) -> torch.Tensor:
        if self.ref_model is not None:
            return self._logprobs(self.ref_model, mb, False)[0]
        with self.model.disable_adapter():  # LoRA: the frozen base is the reference
            return self._logprobs(self.model, mb, False)[0]

    @torch.no_grad()
    def compute_logprobs(self, shard: Batch, base: bool = False) -> Batch:
        """`old_logprobs` (and `ref_logprobs` when a reference exists), [b, R] each, with the
        shard's `row_index`. Runs the micro-batches of the plan (see `rlpost.data.microbatch`),
        the same ones as the first pass of `update`, so that the first ratio is 1. With LoRA,
        `base` asks for `ref_logprobs` (the base model's: adapters disabled) even without a KL
        loss: the controller checks with them that the rollouts serve the adapter."""
        with_ref = self.cfg.algo.kl_coef > 0 or (base and self.lora is not None)
        out: dict[str, list[torch.Tensor]] = {"old_logprobs": [], "ref_logprobs": [], "row_index": []}
        with self._resident():
            for mini in split_shard(shard):
                for mb in mini:
                    out["old_logprobs"].append(self._logprobs(self.model, mb, False)[0].cpu())
                    if with_ref:
                        out["ref_logprobs"].append(self._ref_logprobs(mb).cpu())
                    out["row_index"].append(mb["row_index"])
        return Batch({k: torch.cat(v) for k, v in out.items() if v})

    # --------------------------------------------------------------------------------- update
    def _global_sum(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item())

    def update(self, shard: Batch) -> dict[str, float]:
        """PPO epochs over this rank's planned mini-batches; one optimizer step per mini-batch.
        Returns metrics already reduced over ranks (identical on every rank)."""
        with self._resident():
            return self._update(shard)

    def _update(self, shard: Batch) -> dict[str, float]:
        a = self.cfg.algo
        stats = _Stats(self.device)
        first_step_done = False
        minis = split_shard(shard)
        for _ in range(a.ppo_epochs):
            for mini in minis:
                mask = torch.cat([mb["response_mask"] for mb in mini])
                if a.loss_agg_mode == "token-mean":
                    denom = self._global_sum(mask.sum().item())
                else:
                    denom = self._global_sum((mask.sum(-1) > 0).sum().item())
                for mb in mini:
                    ratio_dev = self._micro_step(mb, denom, stats)
                    if not first_step_done:
                        stats.max("actor/first_ratio_dev", ratio_dev)
                grad_norm = self._optimizer_step(stats)
                stats.add("actor/grad_norm", grad_norm, 1.0)
                stats.add("actor/skipped_steps", float(not math.isfinite(grad_norm)), 0.0)
                first_step_done = True
        stats.set("actor/lr", self.scheduler.get_last_lr()[0])
        return stats.reduce()

    def _micro_step(self, mb: Batch, denom: float, stats: "_Stats") -> float:
        a = self.cfg.algo
        logp, entropy = self._logprobs(self.model, mb, with_entropy=True)  # packs on the CPU first
        mask = mb["response_mask"].to(self.device).float()
        adv = mb["advantages"].to(self.device).float()[:, None]
        old = mb["old_logprobs"].to(self.device)
        pg, ratio, clipped = ppo_clip_loss(logp, old, adv, a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c)
        n = mask.sum().item()
        if a.rollout_is != "none":  # the sampler is not the policy scored here: reweight (TIS)
            rollout = mb["rollout_logprobs"].to(self.device)
            weights, truncated = truncated_is_weights(old, rollout, mask, a.rollout_is, a.rollout_is_threshold)
            pg = pg * weights
            stats.add("rollout_corr/is_weight_mean", (weights * mask).sum().item(), n)
            stats.add("rollout_corr/truncated_frac", (truncated.float() * mask).sum().item(), n)
            stats.max("rollout_corr/is_weight_max", (weights * mask).max().item() if n else -math.inf)
            kl = kl_penalty(rollout, old, "k3")  # KL(rollout || trainer), per token
            stats.add("rollout_corr/kl", (kl * mask).sum().item(), n)
        scale = self.world_size
        agg = partial(aggregate, mask=mask, mode=a.loss_agg_mode, denominator=denom,
                      norm_length=self.cfg.rollout.max_response_length)
        loss = agg(pg) * scale
        if a.kl_coef > 0:
            kl = kl_penalty(logp, mb["ref_logprobs"].to(self.device), a.kl_estimator)
            loss = loss + a.kl_coef * agg(kl) * scale
            stats.add("actor/kl", (kl.detach() * mask).sum().item(), mask.sum().item())
        if a.entropy_coef:
            loss = loss - a.entropy_coef * agg(entropy) * scale
        loss.backward()
        real = mask.bool()
        stats.add("actor/pg_loss", (pg.detach() * mask).sum().item(), n)
        stats.add("actor/pg_clipfrac", (clipped.float() * mask).sum().item(), n)
        stats.add("actor/entropy", (entropy.detach() * mask).sum().item(), n)
        ratio = ratio.detach()
        # every rank records every key (collective reduce); an empty micro-batch adds -inf/+inf
        stats.max("actor/ppo_ratio_max", ratio[real].max().item() if n else -math.inf)
        stats.min("actor/ppo_ratio_min", ratio[real].min().item() if n else math.inf)
        return (ratio[real] - 1).abs().max().item() if n else 0.0

    def _optimizer_step(self, stats: "_Stats") -> float:
        clip = self.cfg.trainer.optim.grad_clip
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        norm = float(full_tensor(norm).item())
        if math.isfinite(norm):  # a NaN/inf gradient skips the step (counted in actor/skipped_steps)
            cuda = self.device.type == "cuda"
            if cuda:
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
                before = torch.cuda.memory_allocated(self.device)
            start = time.perf_counter()
            self.optimizer.step()
            if cuda:
                torch.cuda.synchronize(self.device)
                stats.max("perf/optimizer_peak_gb", (torch.cuda.max_memory_allocated(self.device) - before) / 2**30)
            stats.max("timing_s/optimizer_step", time.perf_counter() - start)
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # ---------------------------------------------------------------------------- weight sync
    def init_weight_sync(self, host: str, port: int, world_size: int, transport: str) -> None:
        """Called on the ranks that send (rank 0; with the ipc transport every rank that shares
        its GPU with a rollout actor)."""
        self.sync_group = SyncGroup(host, port, 0, world_size, str(self.device),
                                    self.cfg.weight_sync.timeout_s, transport)

    def _export(self, kind: str):
        """The full tensors of one sync `kind`, in its manifest's order (a generator of
        collectives: every rank runs it to the end)."""
        if kind not in self.manifests:
            raise ValueError(f"weight sync kind {kind!r} does not fit this run (model.lora.rank="
                             f"{self.cfg.model.lora.rank}, mode={self.cfg.model.lora.mode}): it sends "
                             f"{sorted(self.manifests)}")
        if kind == "full":
            # `.to(device)`: with `optim.offload=cpu` FSDP keeps the shards on the host for good
            return (full_tensor(p.detach().to(self.device)).to(self.compute_dtype)
                    for _, p in self.model.named_parameters())
        # merged: W + scale B A computed out of place per parameter; the shards are never written
        named = {"merged": lambda: merged_weights(self.model, self.compute_dtype),
                 "base": lambda: base_weights(self.model, self.compute_dtype),
                 "adapter": lambda: adapter_weights(self.model, ADAPTER_DTYPE)}[kind]()
        return (t for _, t in named)

    def push_weights(self, version: int, keep_on_gpu: bool = False, kind: str | None = None) -> dict[str, float]:
        """All ranks gather full tensors (FSDP all-gather); rank 0 sends them to the rollouts.
        `kind` (`lora.SYNC_KINDS`; default: the one that carries the whole model) says what the sync
        carries. Offloaded shards (`trainer.param_offload`) come to the device for the gather
        and go back afterwards unless `keep_on_gpu`."""
        kind = kind or sync_kinds(self.cfg, first=True)[0]
        with stacks_if_stuck(self.cfg.weight_sync.timeout_s / 2), self._resident(self.model, keep=keep_on_gpu):
            tensors = self._export(kind)
            if self.sync_group is None:  # this rank only takes part in the gathers
                for _ in tensors:
                    pass
                return {}
            ws = self.cfg.weight_sync
            cuda = self.device.type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
                before = torch.cuda.memory_allocated(self.device)
            stats = send_weights(self.sync_group, self.manifests[kind], tensors, version,
                                 ws.bucket_mb * 2**20, ws.verify)
        out = {"weight_sync/bytes": float(stats.bytes), "weight_sync/send_s": stats.seconds,
               "weight_sync/send_header_s": stats.header_s, "weight_sync/send_verify_s": stats.verify_s}
        if cuda:  # what the export needs beyond the trainer's own memory (gathers, buckets)
            out["perf/sync_peak_gb"] = (torch.cuda.max_memory_allocated(self.device) - before) / 2**30
        return out

    def base_checksums(self) -> list[int]:
        """Checksums of this rank's shards of the base (non-adapter) parameters: syncs and LoRA
        updates must leave them bitwise as they were."""
        named = base_named_parameters(self.model) if self.lora is not None else self.model.named_parameters()
        return [checksum(p.detach().to_local() if hasattr(p, "to_local") else p.detach()) for _, p in named]

    # ----------------------------------------------------------------------------- checkpoints
    def _state_dict_options(self):
        """With LoRA the checkpoint holds the trainable parameters (the adapter) only: the frozen
        base comes from `model.path` again on resume."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(ignore_frozen_params=self.lora is not None)

    def _get_state_dict(self, layerwise: bool):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        options = self._state_dict_options()
        model_sd, optim_sd = get_state_dict(self.model, [] if layerwise else self.optimizer, options=options)
        if options.ignore_frozen_params:  # it keeps a frozen weight under its tied name (lm_head)
            trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
            model_sd = {k: v for k, v in model_sd.items() if k in trainable}
        return model_sd, optim_sd, options

    def save_checkpoint(self, folder: str) -> None:
        """`trainer/` (DCP: the model's trainable parameters and the optimizer state), each
        rank's `trainer_rank<r>.pt`, and with LoRA `adapter/`: a peft adapter folder (rank 0)
        that `rlpost export` merges into the base model."""
        import torch.distributed.checkpoint as dcp

        layerwise = isinstance(self.optimizer, LayerwiseAdamW)
        model_sd, optim_sd, _ = self._get_state_dict(layerwise)
        state = {"model": model_sd} if layerwise else {"model": model_sd, "optimizer": optim_sd}
        dcp.save(state, checkpoint_id=os.path.join(folder, "trainer"))
        if self.lora is not None:
            adapter = list(adapter_weights(self.model, ADAPTER_DTYPE))  # a collective: every rank
            if self.rank == 0:
                save_adapter(adapter, self.lora, Path(folder) / "adapter", self.model_path)
        # per rank: RNG, scheduler and (layerwise) this rank's host-resident optimizer shards
        torch.save({"rng": torch.get_rng_state(), "scheduler": self.scheduler.state_dict(),
                    "optimizer": self.optimizer.state_dict() if layerwise else None},
                   Path(folder) / f"trainer_rank{self.rank}.pt")
        dist.barrier()

    def load_checkpoint(self, folder: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        has_adapter = (Path(folder) / "adapter").is_dir()
        if has_adapter != (self.lora is not None):
            raise ValueError(f"checkpoint {folder} was saved " + ("with" if has_adapter else "without")
                             + f" LoRA, but this run has model.lora.rank={self.cfg.model.lora.rank}: "
                             "resume with the settings of the run that saved it")
        layerwise = isinstance(self.optimizer, LayerwiseAdamW)
        model_sd, optim_sd, options = self._get_state_dict(layerwise)
        state = {"model": model_sd} if layerwise else {"model": model_sd, "optimizer": optim_sd}
        dcp.load(state, checkpoint_id=os.path.join(folder, "trainer"))
        if options.ignore_frozen_params:  # the frozen base stays as loaded from model.path
            options = dataclasses.replace(options, strict=False)
        result = set_state_dict(self.model, [] if layerwise else self.optimizer, model_state_dict=state["model"],
                                optim_state_dict={} if layerwise else state["optimizer"], options=options)
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        missing = [k for k in result.missing_keys if k in trainable]
        if missing or result.unexpected_keys:
            raise ValueError(f"checkpoint {folder}: trainable parameters {missing[:3]} not in it, or keys "
                             f"{result.unexpected_keys[:3]} the model does not have")
        extra = torch.load(Path(folder) / f"trainer_rank{self.rank}.pt", weights_only=False)
        torch.set_rng_state(extra["rng"])
        self.scheduler.load_state_dict(extra["scheduler"])
        if layerwise:
            self.optimizer.load_state_dict(extra["optimizer"])  # copied into the pinned buffers

    # ------------------------------------------------------------------------ colocate memory
    def memory_report(self) -> dict[str, float]:
        """GPU memory (bytes) this rank keeps between phases once training runs: what is
        allocated now plus Adam's two moments when they will live on the GPU (created lazily at
        the first step)."""
        if self.device.type != "cuda":
            return {}
        free, total = torch.cuda.mem_get_info(self.device)
        on_gpu_states = self.cfg.trainer.optim.offload == "none"
        local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                    for p in self.model.parameters() if p.requires_grad)
        states = 2 * 4 * local if on_gpu_states else 0  # float32 exp_avg + exp_avg_sq
        return {"total": float(total), "free": float(free),
                "resident": float(torch.cuda.memory_allocated(self.device) + states)}

    def release_memory(self) -> None:
        """Colocate placement: hand the allocator's cached blocks back to the driver so that the
        rollout engine can wake up into them (once per phase, not inside one)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def build_optimizer(model, o) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (with LoRA: the adapter only), with the states where
    `trainer.optim.offload` says (built once per run)."""
    kwargs = {"lr": o.lr, "betas": tuple(o.betas), "eps": o.eps, "weight_decay": o.weight_decay}
    if o.offload == "layerwise":  # units left without a trainable parameter are dropped
        units = [[p for p in unit if p.requires_grad] for unit in fsdp_units(model)]
        return LayerwiseAdamW(units, prefetch_layers=o.prefetch_layers, **kwargs)
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **kwargs)


def use_packed_layout(layout: str, attn_implementation: str) -> bool:
    """`auto`: packed only with a varlen attention kernel. With sdpa/eager, transformers turns a
    packed row into a dense [T, T] block-diagonal mask: quadratic in the tokens of a whole
    micro-batch, much slower than padding for many short sequences."""
    if layout == "auto":
        return attn_implementation.startswith("flash_attention") or attn_implementation == "rlpost_varlen"
    return layout == "packed"


def total_optimizer_steps(cfg: TrainConfig) -> int:
    return cfg.trainer.total_steps * cfg.algo.ppo_epochs * (cfg.data.train_batch_size // mini_batch_size(cfg))


def lr_factor(o, total: int, step: int) -> float:
    """Learning rate at optimizer step `step`, as a fraction of `optim.lr`: linear warm-up, then
    constant or cosine decay to `min_lr_ratio` at the last step."""
    if step < o.warmup_steps:
        return (step + 1) / o.warmup_steps
    if o.lr_schedule == "cosine":
        return cosine(step - o.warmup_steps, max(total - o.warmup_steps - 1, 1), o.min_lr_ratio)
    return 1.0


def full_tensor_meta(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor with the full (unsharded) shape of `p` and the sync dtype."""
    return torch.empty(p.shape, dtype=dtype, device="meta")


class _Stats:
    """Metric accumulators reduced over the trainer ranks: sums/counts, maxima, minima."""

    def __init__(self, device):
        self.device = device
        self.sums: dict[str, list[float]] = {}
        self.maxes: dict[str, float] = {}
        self.mins: dict[str, float] = {}
        self.values: dict[str, float] = {}

    def add(self, key, total, count):
        s = self.sums.setdefault(key, [0.0, 0.0])
        s[0] += total
        s[1] += count

    def max(self, key, value):
        self.maxes[key] = max(self.maxes.get(key, -math.inf), value)

    def min(self, key, value):
        self.mins[key] = min(self.mins.get(key, math.inf), value)

    def set(self, key, value):
        self.values[key] = value

    def reduce(self) -> dict[str, float]:
        keys = sorted(self.sums)
        out = dict(self.values)
        if keys:
            t = torch.tensor([v for k in keys for v in self.sums[k]], dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            for i, k in enumerate(keys):
                total, count = t[2 * i].item(), t[2 * i + 1].item()
                # count 0 marks a pure sum (e.g. skipped steps); else a mean over count
                out[k] = total / count if count else total
        for table, op in ((self.maxes, dist.ReduceOp.MAX), (self.mins, dist.ReduceOp.MIN)):
            keys = sorted(table)
            if keys:
                t = torch.tensor([table[k] for k in keys], dtype=torch.float64, device=self.device)
                dist.all_reduce(t, op=op)
                out.update(dict(zip(keys, t.tolist())))
        return out
