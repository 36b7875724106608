"""The trainer rank: an FSDP2-sharded policy (and frozen reference), log-probs and PPO updates.

A plain class: the controller wraps it in a Ray actor, tests call it directly. Every method that
runs collectives must be called on all ranks of the trainer group at once.

Loss normalisation across data-parallel ranks: FSDP averages gradients over ranks, so each rank
scales its loss by world_size and divides by the *global* token (or sequence) count of the
mini-batch. Micro-batches and ranks then add up to exactly the full mini-batch loss.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from rlpost.algos.losses import aggregate, kl_penalty, ppo_clip_loss, truncated_is_weights
from rlpost.config import TrainConfig
from rlpost.data.batch import Batch
from rlpost.data.microbatch import split_shard
from rlpost.models.loading import DTYPES, load_causal_lm
from rlpost.models.tiny import cosine
from rlpost.trainer.fsdp import fsdp_units, full_tensor, params_on, shard_model
from rlpost.trainer.optim import LayerwiseAdamW
from rlpost.trainer.logprobs import response_logprobs
from rlpost.weightsync.manifest import spec_of
from rlpost.weightsync.sync import send_weights
from rlpost.weightsync.transport import SyncGroup


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
        self.model = shard_model(load_causal_lm(model_path, "float32", m.attn_implementation,
                                                m.trust_remote_code), self.device, self.compute_dtype,
                                 cpu_offload=o.offload == "cpu")
        self.model.train()
        self.optimizer = build_optimizer(self.model, o)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, partial(lr_factor, o, total_optimizer_steps(cfg)))
        self.ref_model = None
        if cfg.algo.kl_coef > 0:
            ref = load_causal_lm(model_path, "float32", m.attn_implementation, m.trust_remote_code)
            self.ref_model = shard_model(ref, self.device, self.compute_dtype).eval().requires_grad_(False)
        self.packed = use_packed_layout(cfg.trainer.layout, m.attn_implementation)
        self.sync_group: SyncGroup | None = None
        self.manifest = [spec_of(n, full_tensor_meta(p, self.compute_dtype))
                         for n, p in self.model.named_parameters()]
        if cfg.trainer.param_offload:  # shards live on the CPU between phases
            for model in (self.model, self.ref_model):
                if model is not None:
                    model.to("cpu")

    @contextmanager
    def _resident(self):
        """With `trainer.param_offload`, the shards come to the device for one phase and go back."""
        with ExitStack() as stack:
            if self.cfg.trainer.param_offload:
                for model in (self.model, self.ref_model):
                    if model is not None:
                        stack.enter_context(params_on(model, self.device))
            yield

    # ------------------------------------------------------------------------------ log-probs
    def _logprobs(self, model, mb: Batch, with_entropy: bool):
        """Per-token log-probs [b, R] of the response tokens (and entropy [b, R])."""
        return response_logprobs(model, mb, self.cfg.rollout.temperature, self.packed, with_entropy)

    @torch.no_grad()
    def compute_logprobs(self, shard: Batch) -> Batch:
        """`old_logprobs` (and `ref_logprobs` when a reference exists), [b, R] each, with the
        shard's `row_index`. Runs the micro-batches of the plan (see `rlpost.data.microbatch`),
        the same ones as the first pass of `update`, so that the first ratio is 1."""
        out: dict[str, list[torch.Tensor]] = {"old_logprobs": [], "ref_logprobs": [], "row_index": []}
        with self._resident():
            for mini in split_shard(shard):
                for mb in mini:
                    out["old_logprobs"].append(self._logprobs(self.model, mb, False)[0].cpu())
                    if self.ref_model is not None:
                        out["ref_logprobs"].append(self._logprobs(self.ref_model, mb, False)[0].cpu())
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
        loss = aggregate(pg, mask, a.loss_agg_mode, denom) * scale
        if self.ref_model is not None:
            kl = kl_penalty(logp, mb["ref_logprobs"].to(self.device), a.kl_estimator)
            loss = loss + a.kl_coef * aggregate(kl, mask, a.loss_agg_mode, denom) * scale
            stats.add("actor/kl", (kl.detach() * mask).sum().item(), mask.sum().item())
        if a.entropy_coef:
            loss = loss - a.entropy_coef * aggregate(entropy, mask, a.loss_agg_mode, denom) * scale
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

    def push_weights(self, version: int, keep_on_gpu: bool = False) -> dict[str, float]:
        """All ranks gather full tensors (FSDP all-gather); rank 0 sends them to the rollouts.
        Offloaded shards (`trainer.param_offload`) come to the device for the gather and go back
        afterwards unless `keep_on_gpu`."""
        with params_on(self.model, self.device, keep=keep_on_gpu) if self.cfg.trainer.param_offload \
                else ExitStack():
            # `.to(device)`: with `optim.offload=cpu` FSDP keeps the shards on the host for good
            tensors = (full_tensor(p.detach().to(self.device)).to(self.compute_dtype)
                       for _, p in self.model.named_parameters())
            if self.sync_group is None:  # this rank only takes part in the gathers
                for _ in tensors:
                    pass
                return {}
            ws = self.cfg.weight_sync
            cuda = self.device.type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
                before = torch.cuda.memory_allocated(self.device)
            stats = send_weights(self.sync_group, self.manifest, tensors, version,
                                 ws.bucket_mb * 2**20, ws.verify)
        out = {"weight_sync/bytes": float(stats.bytes), "weight_sync/send_s": stats.seconds}
        if cuda:  # what the export needs beyond the trainer's own memory (gathers, buckets)
            out["perf/sync_peak_gb"] = (torch.cuda.max_memory_allocated(self.device) - before) / 2**30
        return out

    # ----------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, folder: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        layerwise = isinstance(self.optimizer, LayerwiseAdamW)
        model_sd, optim_sd = get_state_dict(self.model, [] if layerwise else self.optimizer)
        state = {"model": model_sd} if layerwise else {"model": model_sd, "optimizer": optim_sd}
        dcp.save(state, checkpoint_id=os.path.join(folder, "trainer"))
        # per rank: RNG, scheduler and (layerwise) this rank's host-resident optimizer shards
        torch.save({"rng": torch.get_rng_state(), "scheduler": self.scheduler.state_dict(),
                    "optimizer": self.optimizer.state_dict() if layerwise else None},
                   Path(folder) / f"trainer_rank{self.rank}.pt")
        dist.barrier()

    def load_checkpoint(self, folder: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        layerwise = isinstance(self.optimizer, LayerwiseAdamW)
        model_sd, optim_sd = get_state_dict(self.model, [] if layerwise else self.optimizer)
        state = {"model": model_sd} if layerwise else {"model": model_sd, "optimizer": optim_sd}
        dcp.load(state, checkpoint_id=os.path.join(folder, "trainer"))
        set_state_dict(self.model, [] if layerwise else self.optimizer, model_state_dict=state["model"],
                       optim_state_dict={} if layerwise else state["optimizer"])
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
    """AdamW with the states where `trainer.optim.offload` says (built once per run)."""
    kwargs = {"lr": o.lr, "betas": tuple(o.betas), "eps": o.eps, "weight_decay": o.weight_decay}
    if o.offload == "layerwise":
        return LayerwiseAdamW(fsdp_units(model), prefetch_layers=o.prefetch_layers, **kwargs)
    return torch.optim.AdamW(model.parameters(), **kwargs)


def use_packed_layout(layout: str, attn_implementation: str) -> bool:
    """`auto`: packed only with a varlen attention kernel. With sdpa/eager, transformers turns a
    packed row into a dense [T, T] block-diagonal mask: quadratic in the tokens of a whole
    micro-batch, much slower than padding for many short sequences."""
    if layout == "auto":
        return attn_implementation.startswith("flash_attention") or attn_implementation == "rlpost_varlen"
    return layout == "packed"


def total_optimizer_steps(cfg: TrainConfig) -> int:
    mini = cfg.algo.ppo_mini_batch_size or cfg.data.train_batch_size
    return cfg.trainer.total_steps * cfg.algo.ppo_epochs * (cfg.data.train_batch_size // mini)


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
