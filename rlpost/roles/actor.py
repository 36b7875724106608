"""The actor role on a trainer rank: the policy's log-probs, its update, and its weights for the
rollouts. It runs on the FSDP2 engine (`rlpost.trainer.engine`: the policy `model.path`,
`trainer.optim`, LoRA when configured, metrics `actor/...`, checkpoint `trainer/`), which loops
over epochs and mini-batches; the actor brings the loss of a micro-batch, the one the algorithm
names (`rlpost.algos.policy_loss`): it knows no algorithm itself.

The KL reference is a frozen copy of the starting model, or with LoRA the policy itself with its
adapters disabled (the frozen base): no second model.

A plain class: the controller wraps it in a Ray actor, tests call it directly. Every method that
runs collectives must be called on all ranks of the trainer group at once.
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from rlpost.algos.algorithms import ALGORITHMS
from rlpost.algos.policy_loss import POLICY_LOSSES, LossInputs
from rlpost.config import TrainConfig
from rlpost.data.batch import Batch
from rlpost.data.microbatch import padded_tokens, split_shard
from rlpost.models.loading import load_causal_lm
from rlpost.models.lora import ADAPTER_DTYPE, save_adapter
from rlpost.roles.actor_weights import ActorWeights
from rlpost.trainer.engine import EngineSpec, FSDPEngine
from rlpost.trainer.logprobs import resolve_layout, response_logprobs
from rlpost.trainer.lora import adapter_weights, adapters_off
from rlpost.trainer.profile import maybe_profiled, part
from rlpost.trainer.stats import Stats
from rlpost.weightsync.sync import SyncStats
from rlpost.weightsync.transport import SyncGroup


class ActorWorker:
    def __init__(
        self, cfg: TrainConfig, model_path: str, rank: int, world_size: int, master_addr: str, master_port: int
    ):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.model_path, m = model_path, cfg.model
        lora = m.lora if m.lora.rank > 0 else None
        load = partial(load_causal_lm, model_path, "float32", m.attn_implementation, m.trust_remote_code)
        spec = EngineSpec(load, cfg.trainer.optim, lora, prefix="actor", name="trainer", step_timing="optimizer_step")
        self.engine = e = FSDPEngine(cfg, spec, rank, world_size, master_addr, master_port)
        self.model, self.device, self.lora = e.model, e.device, e.lora
        self.optimizer = e.optimizer
        self.ref_model = e.frozen_copy() if cfg.algo.kl_coef > 0 and self.lora is None else None
        algorithm = ALGORITHMS.get(cfg.algo.name)
        self.loss_fn = POLICY_LOSSES.get(algorithm.policy_loss)
        self.kl_in_loss = cfg.algo.kl_coef if algorithm.kl == "loss" else 0.0  # else it is in the reward
        self.layout = resolve_layout(cfg.trainer.layout, cfg.model.attn_implementation, cfg.trainer.device)
        self.weights = ActorWeights(cfg, e)
        e.offload_params()

    # ------------------------------------------------------------------------------ log-probs
    def _logprobs(self, model, mb: Batch, with_entropy: bool):
        """Per-token log-probs [b, R] of the response tokens (and entropy [b, R])."""
        return response_logprobs(model, mb, self.cfg.rollout.temperature, self.layout, with_entropy)

    def _resident(self, with_ref: bool):
        """`trainer.param_offload`: the phase's models on the device, the reference only when the
        phase scores with it (at 7B on one GPU its 14 GiB are more than an update has to spare)."""
        return self.engine.resident(self.model, *([self.ref_model] if with_ref and self.ref_model is not None else []))

    def _ref_logprobs(self, mb: Batch) -> torch.Tensor:
        with torch.no_grad():
            if self.ref_model is not None:
                return self._logprobs(self.ref_model, mb, False)[0]
            with adapters_off(self.model):  # LoRA: the frozen base is the reference
                return self._logprobs(self.model, mb, False)[0]

    def compute_logprobs(self, shard: Batch, base: bool = False) -> Batch:
        """`old_logprobs` (and `ref_logprobs` when a reference exists), [b, R] each, with the
        shard's `row_index`. Runs the micro-batches of the plan (see `rlpost.data.microbatch`),
        the same ones as the first pass of `update`, so that the first ratio is 1. With LoRA,
        `base` asks for `ref_logprobs` (the base model's: adapters disabled) even without a KL
        loss: the controller checks with them that the rollouts serve the adapter."""
        with_ref = self.cfg.algo.kl_coef > 0 or (base and self.lora is not None)
        out: dict[str, list[torch.Tensor]] = {"old_logprobs": [], "ref_logprobs": [], "row_index": []}
        with torch.no_grad(), self._resident(with_ref):
            for mini in split_shard(shard):
                for mb in mini:
                    out["old_logprobs"].append(self._logprobs(self.model, mb, False)[0].cpu())
                    if with_ref:
                        out["ref_logprobs"].append(self._ref_logprobs(mb).cpu())
                    out["row_index"].append(mb["row_index"])
        return Batch({k: torch.cat(v) for k, v in out.items() if v})

    # --------------------------------------------------------------------------------- update
    def update(self, shard: Batch, base: bool = False, step: int = 0) -> tuple[dict[str, float], Batch]:
        """PPO epochs over this rank's planned mini-batches; one optimizer step per mini-batch.
        Returns the metrics, already reduced over ranks (identical on every rank), and the
        log-probs this update computed in place of `compute_logprobs` (an empty `Batch` when the
        shard brought its own `old_logprobs`).

        A shard without `old_logprobs` trains in one optimizer step (one epoch, one mini-batch:
        `rlpost.controller.step.old_logprobs_in_update`). The ratio's old policy is then the
        trainer's current weights, exactly what a separate pass would score (for a batch generated
        a version ago too: that lag is what TIS corrects, against `rollout_logprobs`), so the old
        log-probs are the update's own forward, detached (ratio 1), and `ref_logprobs` (with
        `base`, the base model's under LoRA) come from a forward of the reference on each
        micro-batch. One pass over the batch instead of two.

        In the step `trainer.profile_step` names (`step`: the one this update trains) it runs under
        torch.profiler (rlpost/trainer/profile.py)."""
        start = time.perf_counter()
        a = self.cfg.algo
        stats = Stats(self.device)
        fused = "old_logprobs" not in shard
        with_ref = a.kl_coef > 0 or (base and self.lora is not None)
        out: dict[str, list[torch.Tensor]] = {"old_logprobs": [], "ref_logprobs": [], "row_index": []}
        self.engine.phase_peak(start=True)
        with self._resident(fused and with_ref):  # a separate pass scored the reference already
            minis = split_shard(shard)
            if fused and (a.ppo_epochs > 1 or len(minis) > 1):
                raise ValueError(
                    "a shard without old_logprobs must train in one optimizer step (algo.ppo_epochs=1, one "
                    f"mini-batch); this one has {a.ppo_epochs} epochs x {len(minis)} mini-batches"
                )

            def micro_step(mb: Batch, denominator: torch.Tensor, first: bool) -> None:
                with part("reference"):
                    ref = self._ref_logprobs(mb) if fused and with_ref else None
                logp, ratio_dev = self._micro_step(mb, denominator, stats, ref)
                stats.max("perf/microbatch_tokens", float(padded_tokens(mb)))  # for the plan's check
                if first:  # the first optimizer step: its ratios must all be exactly 1
                    stats.max("actor/first_ratio_dev", ratio_dev)
                if fused:  # kept on the device until the end: no copy per micro-batch
                    out["old_logprobs"].append(logp)
                    if ref is not None:
                        out["ref_logprobs"].append(ref)
                    out["row_index"].append(mb["row_index"])

            cuda, profile_step = self.device.type == "cuda", self.cfg.trainer.profile_step
            with maybe_profiled(self.cfg.run.dir, profile_step, step, self.rank, cuda):
                self.engine.train(minis, a.ppo_epochs, a.loss_agg_mode, micro_step, stats)
            if self.device.type == "cuda":  # what the memory plan (controller/plan.py) predicts, and
                stats.max("perf/update_peak_gb", self.engine.phase_peak())  # the allocator's reserve over it
                stats.max("perf/update_reserved_gb", torch.cuda.max_memory_reserved(self.device) / 2**30)
                free, total = torch.cuda.mem_get_info(self.device)  # the whole GPU: context, NCCL, others
                stats.max("perf/device_used_gb", (total - free) / 2**30)
            metrics = stats.reduce()
            logprobs = Batch({k: torch.cat(v).cpu() for k, v in out.items() if v})
        metrics["timing_s/update_worker"] = time.perf_counter() - start  # the rest of update's time is Ray's
        return metrics, logprobs

    def _micro_step(self, mb: Batch, denom: torch.Tensor, stats: Stats, ref_logp=None):
        """Forward, the algorithm's loss, backward on one micro-batch; returns the log-probs of
        the forward (detached) and max |ratio - 1| (a tensor). Without `old_logprobs` in `mb`
        they are taken from this forward."""
        with part("forward"):
            logp, entropy = self._logprobs(self.model, mb, with_entropy=True)  # packs on the CPU first
        dev = self.device
        old = mb["old_logprobs"].to(dev) if "old_logprobs" in mb else logp.detach()
        if ref_logp is None and "ref_logprobs" in mb:
            ref_logp = mb["ref_logprobs"]
        adv = mb["advantages"].to(dev).float()
        out = self.loss_fn(
            LossInputs(
                logp=logp,
                old_logp=old,
                advantages=adv[:, None] if adv.dim() == 1 else adv,  # per sequence or per token
                loss_mask=mb["loss_mask"].to(dev).float(),
                denominator=denom,
                norm_length=self.cfg.rollout.max_response_length,
                entropy=entropy,
                kl_coef=self.kl_in_loss,
                ref_logp=ref_logp.to(dev) if ref_logp is not None else None,
                rollout_logp=mb["rollout_logprobs"].to(dev),
            ),
            self.cfg.algo,
        )
        with part("backward"):
            (out.loss * self.world_size).backward()
        stats.merge(out)
        ratio_dev = torch.maximum(out.maxes["actor/ppo_ratio_max"] - 1, 1 - out.mins["actor/ppo_ratio_min"])
        return logp.detach(), ratio_dev.clamp(min=0.0)

    # ---------------------------------------------------------------------------- weight sync
    def init_weight_sync(self, host: str, port: int, world_size: int, transport: str) -> None:
        self.weights.join(host, port, world_size, transport)

    def push_weights(self, version: int, keep_on_gpu: bool = False, kind: str | None = None) -> SyncStats | None:
        return self.weights.push(version, keep_on_gpu, kind)

    def base_checksums(self) -> list[int]:
        return self.weights.base_checksums()

    @property
    def sync_group(self) -> SyncGroup | None:
        return self.weights.group

    # ----------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, folder: str) -> None:
        """The engine's checkpoint and, with LoRA, `adapter/`: a peft adapter folder (rank 0)
        that `rlpost export` merges into the base model."""
        self.engine.save_checkpoint(folder)
        if self.lora is not None:
            adapter = list(adapter_weights(self.model, ADAPTER_DTYPE))  # a collective: every rank
            if self.rank == 0:
                save_adapter(adapter, self.lora, Path(folder) / "adapter", self.model_path)
        dist.barrier()

    def load_checkpoint(self, folder: str) -> None:
        has_adapter = (Path(folder) / "adapter").is_dir()
        if has_adapter != (self.lora is not None):
            raise ValueError(
                f"checkpoint {folder} was saved "
                + ("with" if has_adapter else "without")
                + f" LoRA, but this run has model.lora.rank={self.cfg.model.lora.rank}: "
                "resume with the settings of the run that saved it"
            )
        self.engine.load_checkpoint(folder)

    # ------------------------------------------------------------------------ colocate memory
    def memory_report(self) -> dict[str, float]:
        return self.engine.memory_report()

    def cuda_device(self) -> str:
        """This rank's GPU as its node numbers it (what Ray put in the actor's CUDA_VISIBLE_DEVICES)."""
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")

    def release_memory(self) -> None:
        self.engine.release_memory()

    def shutdown(self) -> None:
        self.engine.shutdown()
