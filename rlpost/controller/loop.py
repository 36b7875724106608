"""The single controller: one process that drives the rollout and trainer groups through training.

One step (shared/DESIGN.md): generate -> reward -> old/ref log-probs (from the update's own
forward when the batch trains in one optimizer step: `step.old_logprobs_in_update`) -> advantages
-> update -> weight sync (version + 1) -> metrics, and on schedule validation and checkpoints. The
controller holds no model: it tokenizes, scores, computes advantages and keeps the books. Batch
production is `controller/rollouts.py`, the sync wiring `controller/weights.py`, the pure parts of
a step `controller/step.py`.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from rlpost.algos.algorithms import get_algorithm, needed_roles
from rlpost.algos.filters import BATCH_FILTERS
from rlpost.config import TrainConfig, colocated_on_cuda, config_dict
from rlpost.controller import checkpoint
from rlpost.controller.cluster import Placement, WorkerGroup, start_ray
from rlpost.controller.rollouts import Rollouts
from rlpost.controller.setup import load_data, make_run_dir
from rlpost.controller.step import (
    advantages,
    batch_metrics,
    check_rollout_serves_adapter,
    check_staleness,
    filter_overlong,
    old_logprobs_in_update,
    plan_padding_fraction,
    put_logprobs,
    sampling_params,
    step_plan,
    timed,
)
from rlpost.controller.weights import WeightSync, check_colocated_memory
from rlpost.data.batch import Batch
from rlpost.data.microbatch import shard_batch
from rlpost.metrics.trackers import SampleLog, Trackers
from rlpost.models.loading import load_tokenizer, resolve_model_path, start_eval
from rlpost.rewards import get_reward_fn
from rlpost.rollout.worker import RolloutWorker
from rlpost.trainer.actor import ActorWorker


class Controller:
    def __init__(self, cfg: TrainConfig, log=print):
        self.cfg, self.log = cfg, log
        self.run_dir = make_run_dir(cfg)
        log(f"run folder: {self.run_dir}")
        self.samples = SampleLog(self.run_dir, cfg.logger.samples_per_step)
        self.model_path = resolve_model_path(cfg.model, cfg.data, cfg.trainer.device, log=log)
        self.tokenizer = load_tokenizer(self.model_path, cfg.model.trust_remote_code)
        self.loader, self.val_rows, self.dropped_prompts = load_data(cfg, self.tokenizer, log)
        self.version, self.step = 0, 0
        self.lora = cfg.model.lora.rank > 0
        self.algorithm = get_algorithm(cfg.algo.name)
        self.keep_groups = BATCH_FILTERS[self.algorithm.batch_filter]
        # the reference lives in the actor's group: a frozen copy, or with LoRA the adapters off
        roles = needed_roles(self.algorithm, cfg.algo.kl_coef, reward_model=False)
        log(f"algorithm {self.algorithm.name} ({self.algorithm.paper}): roles {', '.join(roles)}")
        self._adapter_probe_due = self.lora  # check_rollout_serves_adapter at the next chance
        self.placement = self.trainers = self.rollouts = None
        try:
            self._start_workers()
            if cfg.trainer.resume != "none":
                self._resume()
            self.sync_weights()  # the rollouts start from exactly the trainer's weights, verified
        except BaseException:
            self.shutdown()  # no actors or placement group outlive a failed start
            raise

    def _start_workers(self) -> None:
        cfg = self.cfg
        start_ray(cfg)
        self.placement = p = Placement.create(cfg)
        ws = cfg.trainer.world_size
        master = p.address_of_bundle(p.trainer_bundles[0])
        self.trainers = WorkerGroup(
            ActorWorker, cfg, p, p.trainer_bundles, "trainer", lambda r: (cfg, self.model_path, r, ws, *master)
        )
        if colocated_on_cuda(cfg):  # the rollout engines start only once the trainer holds its memory
            check_colocated_memory(cfg, self.trainers.call("memory_report"))
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        self.rollouts = WorkerGroup(
            RolloutWorker, cfg, p, p.rollout_bundles, "rollout", lambda r: (cfg, self.model_path, r, pad, eos)
        )
        self.batches = Rollouts(
            cfg, self.rollouts, self.loader, pad, self.tokenizer, get_reward_fn(cfg.reward.fn), self.log
        )
        self.weights = WeightSync(cfg, p, self.trainers, self.rollouts, self.log)

    def sync_weights(self) -> dict[str, float]:
        return self.weights.sync(self.version)

    # ---------------------------------------------------------------------------- one step
    def train_step(self) -> dict[str, float]:
        cfg, timing = self.cfg, {}
        scored = self.batches.next_scored(self.step, self.keep_groups)  # timing_s/gen, reward (, filter)
        batch = scored.batch
        staleness = check_staleness(batch, self.version, self.cfg.algo.max_staleness if self.batches.overlap else 0)
        self.samples.write(self.step + 1, scored.rows, cfg.rollout.n, scored.responses, scored.scores.tolist())
        truncated = filter_overlong(batch, cfg, self.tokenizer.eos_token_id)
        lengths, plan = step_plan(batch, cfg)
        probe = self._adapter_probe_due and batch["weight_version"].min().item() >= 1 + staleness
        in_update = old_logprobs_in_update(cfg)  # else a separate forward pass brings them first
        if not in_update:
            with timed(timing, "logprob"):
                parts = self.trainers.call_sharded("compute_logprobs", shard_batch(batch, plan), probe)
                put_logprobs(batch, parts)
        batch["advantages"] = advantages(batch, cfg)
        with timed(timing, "update"):
            results = self.trainers.call_sharded("update", shard_batch(batch, plan), probe and in_update)
        actor = results[0][0]
        if in_update:
            put_logprobs(batch, [logprobs for _, logprobs in results])
        lora_check = self._check_adapter(batch, staleness)
        actor["perf/padding_fraction"] = plan_padding_fraction(lengths, plan)
        self.version += 1
        if cfg.cluster.placement == "colocate":
            self.trainers.call("release_memory")  # vLLM wakes up into this memory
        sync = self.sync_weights()
        return {
            **batch_metrics(batch, scored.scores, scored.errors, cfg.rollout.n),
            **scored.metrics,
            "response_length/truncated_frac": truncated / len(batch),
            "reward/shaped_mean": batch["rewards"].mean().item(),
            **actor,
            **sync,
            **timing,
            **lora_check,
            "rollout/staleness": float(staleness),
            "data/dropped_prompts": float(self.dropped_prompts),
        }

    def _check_adapter(self, batch: Batch, staleness: int) -> dict[str, float]:
        """LoRA: while the rollouts' use of the adapter is to be checked, the batch carries the
        base model's log-probs too (`ref_logprobs`: one more forward, adapters disabled; free when
        the KL loss needs them anyway)."""
        if not (self.lora and "ref_logprobs" in batch):
            return {}
        check = check_rollout_serves_adapter(batch, staleness)
        if check["lora/adapter_check"]:  # proven once: again only after the next validation
            self._adapter_probe_due = False
        return check

    # ---------------------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        self._adapter_probe_due = self.lora  # check the rollouts' adapter again at the next step
        params = sampling_params(self.cfg, self.cfg.run.seed, n=1, greedy=self.cfg.rollout.val_greedy)
        return self.batches.validate(self.val_rows, params)

    # ----------------------------------------------------------------------------- checkpoints
    def save(self) -> Path:
        state = {
            "step": self.step,
            "version": self.version,
            **self.batches.state_dict(),
            "python_rng": random.getstate(),
            "torch_rng": torch.get_rng_state(),
        }
        return checkpoint.save(self.run_dir, self.step, state, self.trainers, self.cfg.trainer.keep_checkpoints)

    def _resume(self) -> None:
        folder = checkpoint.find(self.run_dir, self.cfg.trainer.resume)
        if folder is None:
            self.log(
                f"trainer.resume={self.cfg.trainer.resume}: no complete checkpoint in {self.run_dir}, starting fresh"
            )
            return
        state = checkpoint.load(folder, self.trainers)
        self.step, self.version = state["step"], state["version"]
        self.batches.load_state_dict(state)
        random.setstate(state["python_rng"])
        torch.set_rng_state(state["torch_rng"])
        self.log(f"resumed from {folder} (step {self.step}, weight version {self.version})")

    # ------------------------------------------------------------------------------------ run
    def _start_metrics(self) -> dict[str, float]:
        out = {k: v for m in self.rollouts.call("memory") for k, v in m.items()}
        if self.step == 0:  # the built tiny model's held-out greedy accuracy and pass@k
            out.update(
                {
                    f"start/{k}": float(v)
                    for k, v in start_eval(self.model_path).items()
                    if k == "greedy_accuracy" or k.startswith("pass@")
                }
            )
            if self.cfg.trainer.val_every:
                out.update(self.validate())
        return out

    def run(self) -> Path:
        from tqdm import tqdm

        cfg = self.cfg
        bar = tqdm(
            total=cfg.trainer.total_steps,
            initial=self.step,
            desc="grpo",
            dynamic_ncols=True,
            disable=not cfg.logger.progress_bar,
        )
        trackers = Trackers(
            cfg.logger.backends,
            self.run_dir,
            cfg.logger.project,
            cfg.logger.wandb_mode,
            config=config_dict(cfg),
            write=tqdm.write,
        )
        try:
            start_metrics = self._start_metrics()
            if start_metrics:
                trackers.log(start_metrics, self.step)
            while self.step < cfg.trainer.total_steps:
                start = time.perf_counter()
                metrics = self.train_step()
                self.step += 1
                metrics["timing_s/step"] = time.perf_counter() - start
                metrics["perf/tokens_per_s"] = metrics.pop("perf/tokens") / metrics["timing_s/step"]
                last = self.step == cfg.trainer.total_steps
                if cfg.trainer.val_every and (self.step % cfg.trainer.val_every == 0 or last):
                    metrics.update(self.validate())
                if cfg.trainer.save_every and (self.step % cfg.trainer.save_every == 0 or last):
                    self.save()
                trackers.log(metrics, self.step)
                bar.set_postfix(
                    reward=f"{metrics['reward/mean']:.3f}",
                    step_s=f"{metrics['timing_s/step']:.2f}",
                    **({"val_acc": f"{metrics['val/accuracy']:.3f}"} if "val/accuracy" in metrics else {}),
                )
                bar.update(1)
        finally:
            bar.close()
            trackers.close()
        return self.run_dir

    def shutdown(self) -> None:
        self.samples.close()
        for group in (self.trainers, self.rollouts):
            if group is not None:
                group.kill()
        if self.placement is not None:
            self.placement.remove()


def train(cfg: TrainConfig, log=print) -> Path:
    controller = Controller(cfg, log=log)
    try:
        return controller.run()
    finally:
        controller.shutdown()


__all__ = ["Controller", "train"]
