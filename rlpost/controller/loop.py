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
import signal
import time
from pathlib import Path

import torch

from rlpost.algos.algorithms import get_algorithm, needed_roles
from rlpost.algos.filters import BATCH_FILTERS
from rlpost.algos.kl_control import KLController
from rlpost.config import TrainConfig, colocated_on_cuda, config_dict
from rlpost.controller import checkpoint
from rlpost.controller.cluster import Placement, WorkerGroup, local_ray_died, quiet_libraries, start_ray
from rlpost.controller.plan import check_plan, gpu_plan, shape_of
from rlpost.controller.rollouts import Rollouts
from rlpost.controller.setup import load_data, make_run_dir, resolve_critic_path, resolve_reward_model_path
from rlpost.controller.signals import Stopped, StopSignals
from rlpost.controller.step import (
    advantages,
    batch_metrics,
    check_rollout_serves_adapter,
    check_staleness,
    filter_overlong,
    kl_in_reward,
    old_logprobs_in_update,
    plan_padding_fraction,
    put_rows,
    reward_kl,
    sampling_params,
    step_plan,
    timed,
)
from rlpost.controller.weights import WeightSync, check_colocated_memory, merge_memory
from rlpost.data.batch import Batch
from rlpost.data.microbatch import shard_batch
from rlpost.metrics.summary import write_report
from rlpost.metrics.trackers import SampleLog, Trackers, trim_logs
from rlpost.models.loading import load_tokenizer
from rlpost.models.reward_model import RewardModelWorker
from rlpost.rewards.executor import RewardPool
from rlpost.rollout.worker import RolloutWorker
from rlpost.tiny.build import resolve_model_path, start_eval
from rlpost.trainer.actor import ActorWorker
from rlpost.trainer.critic import CriticWorker


class Controller:
    def __init__(
        self,
        cfg: TrainConfig,
        log=print,
        restarts: int = 0,
        stop: StopSignals | None = None,
        started: float | None = None,
    ):
        self.cfg, self.log, self.restarts, self.stop = cfg, log, restarts, stop
        self.started = time.monotonic() if started is None else started  # for the summary's wall time
        quiet_libraries(cfg.logger.verbose)
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
        self.roles = needed_roles(self.algorithm, cfg.algo.kl_coef, reward_model=bool(cfg.reward.model.path))
        log(f"algorithm {self.algorithm.name} ({self.algorithm.paper}): roles {', '.join(self.roles)}")
        self.kl = KLController(cfg.algo.kl_coef, cfg.algo.kl_target, cfg.algo.kl_horizon)
        self._adapter_probe_due = self.lora  # check_rollout_serves_adapter at the next chance
        self.placement = self.trainers = self.rollouts = self.critics = self.reward_models = None
        self.reward_pool = None
        try:
            self._start_workers()
            if cfg.trainer.resume != "none":
                self._resume()
            trim_logs(self.run_dir, self.step)  # rows of steps this run will write (again) go
            self.sync_weights()  # the rollouts start from exactly the trainer's weights, verified
        except BaseException:
            self.shutdown()  # no actors or placement group outlive a failed start
            raise

    def _start_workers(self) -> None:
        cfg = self.cfg
        start_ray(cfg)
        if self.stop is not None:  # over Ray's own SIGTERM handler, which aborts the process
            self.stop.install()
        self.placement = p = Placement.create(cfg, self.roles)
        ws = cfg.trainer.world_size
        master = p.address_of_bundle(p.trainer_bundles[0])
        args = lambda r: (cfg, self.model_path, r, ws, *master)  # noqa: E731
        self.trainers = WorkerGroup(ActorWorker, cfg, p, p.trainer_bundles, "trainer", args, self.log)
        if "critic" in self.roles:  # its own process group, on the trainer's bundles
            critic_master = p.address_of_bundle(p.trainer_bundles[0])
            critic_path = resolve_critic_path(cfg, self.model_path)
            args = lambda r: (cfg, critic_path, r, ws, *critic_master)  # noqa: E731
            self.critics = WorkerGroup(CriticWorker, cfg, p, p.trainer_bundles, "critic", args, self.log)
        if "reward_model" in self.roles:  # one per trainer rank, on its device
            rm_path = resolve_reward_model_path(cfg, self.model_path, self.log)
            self.reward_models = WorkerGroup(
                RewardModelWorker, cfg, p, p.trainer_bundles, "reward_model", lambda r: (cfg, rm_path, r), self.log
            )
        if cfg.trainer.device == "cuda":  # the rollout engines start only once the trainers hold their memory
            groups = [*self._trained(), *([self.reward_models] if self.reward_models else [])]
            reports = [group.call("memory_report") for group in groups]
            if colocated_on_cuda(cfg):
                check_colocated_memory(cfg, [merge_memory(per_rank) for per_rank in zip(*reports)])
            if Path(self.model_path, "config.json").is_file():  # the plan, for this GPU (`rlpost plan`)
                check_plan(cfg, gpu_plan(cfg, shape_of(cfg, self.model_path), reports[0][0]["total"]), self.log)
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        devices = p.engine_devices(cfg, self.trainers)  # colocated tensor parallel: the shards' GPUs
        self.rollouts = WorkerGroup(
            RolloutWorker,
            cfg,
            p,
            p.rollout_bundles,
            "rollout",
            lambda r: (cfg, self.model_path, r, pad, eos, devices[r]),
            self.log,
            control=("receive_weights",) if cfg.algo.async_rollouts else (),  # a sync beside the generation
        )
        r = cfg.reward
        self.reward_pool = RewardPool(r.fn, r.kwargs, r.num_workers, r.timeout_s, r.memory_mb, r.error_score)
        self.batches = Rollouts(
            cfg, self.rollouts, self.loader, pad, self.tokenizer, self.reward_pool, self.log, self.reward_models
        )
        self.weights = WeightSync(cfg, p, self.trainers, self.rollouts, self.log)

    def sync_weights(self) -> dict[str, float]:
        return self.weights.sync(self.version)

    # ---------------------------------------------------------------------------- one step
    def train_step(self) -> dict[str, float]:
        cfg, timing = self.cfg, {}
        scored = self.batches.next_scored(self.step, self.keep_groups, self.version)  # timing_s/gen, reward (, filter)
        batch = scored.batch
        staleness = check_staleness(batch, self.version, self.cfg.algo.max_staleness if self.batches.overlap else 0)
        self.samples.write(self.step + 1, scored.rows, cfg.rollout.n, scored.responses, scored.scores.tolist())
        truncated = filter_overlong(batch, cfg, self.tokenizer.eos_token_id)
        lengths, plan = step_plan(batch, cfg)
        probe = self._adapter_probe_due and batch["weight_version"].min().item() >= 1 + staleness
        # critic warm-up: the first steps train the critic only; the policy waits for its values
        warming = self.critics is not None and self.step < cfg.critic.warmup_steps
        in_update = old_logprobs_in_update(cfg) and not warming  # else a separate pass brings them first
        if not in_update:
            with timed(timing, "logprob"):
                put_rows(batch, self.trainers.call_sharded("compute_logprobs", shard_batch(batch, plan), probe))
        if self.critics is not None:
            with timed(timing, "values"):
                put_rows(batch, self.critics.call_sharded("compute_values", shard_batch(batch, plan)))
        extra = self._advantages(batch)
        if self.critics is not None:
            with timed(timing, "critic_update"):
                extra.update(self.critics.call_sharded("update", shard_batch(batch, plan))[0])
        actor, lora_check = {}, {}
        if not warming:
            with timed(timing, "update"):
                results = self.trainers.call_sharded("update", shard_batch(batch, plan), probe and in_update)
            actor = results[0][0]
            if in_update:
                put_rows(batch, [logprobs for _, logprobs in results])
            lora_check = self._check_adapter(batch, staleness)
            actor["perf/padding_fraction"] = plan_padding_fraction(lengths, plan)
            self.version += 1
        if cfg.cluster.placement == "colocate":
            for group in self._trained():
                group.call("release_memory")  # vLLM wakes up into this memory
        sync = self.sync_weights()  # in the warm-up the same version again: a sleeping vLLM dropped it
        self.batches.synced(self.step + 1)
        return {
            **batch_metrics(batch, scored.scores, scored.errors, cfg.rollout.n),
            **scored.metrics,
            **extra,
            "response_length/truncated_frac": truncated / len(batch),
            "reward/shaped_mean": batch["rewards"].mean().item(),
            **actor,
            **sync,
            **timing,
            **lora_check,
            "rollout/staleness": float(staleness),
            "run/restarts": float(self.restarts),
            "data/dropped_prompts": float(self.dropped_prompts),
        }

    def _advantages(self, batch: Batch) -> dict[str, float]:
        """The algorithm's advantages (and with a critic its returns) into `batch`; with the KL in
        the reward, the batch's KL per sequence and the coefficient, which then adapts."""
        cfg = self.cfg
        adv = advantages(batch, cfg, self.kl.coef)
        if isinstance(adv, tuple):  # an estimator with a critic: the returns are its targets
            adv, batch["returns"] = adv
        batch["advantages"] = adv
        if not kl_in_reward(cfg):
            return {}
        kl = reward_kl(batch, cfg).sum(-1).mean().item()
        out = {"kl/reward_kl": kl, "kl/coef": self.kl.coef}
        self.kl.update(kl, len(batch))
        return out

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
            "kl_coef": self.kl.coef,
            "python_rng": random.getstate(),
            "torch_rng": torch.get_rng_state(),
        }
        return checkpoint.save(self.run_dir, self.step, state, self._trained(), self.cfg.trainer.keep_checkpoints)

    def _trained(self) -> list:
        """The worker groups whose weights train (and are checkpointed)."""
        return [g for g in (self.trainers, self.critics) if g is not None]

    def _resume(self) -> None:
        folder = checkpoint.find(self.run_dir, self.cfg.trainer.resume, self.log)
        if folder is None:
            self.log(
                f"trainer.resume={self.cfg.trainer.resume}: no complete checkpoint in {self.run_dir}, starting fresh"
            )
            return
        state = checkpoint.load(folder, self._trained())
        self.step, self.version = state["step"], state["version"]
        self.kl.coef = state.get("kl_coef", self.kl.coef)
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
            k = self.cfg.trainer.start_pass_k
            if k and "start/pass@1" not in out:  # a real model's headroom, measured here
                params = sampling_params(self.cfg, self.cfg.run.seed, n=k, greedy=False)
                out.update(self.batches.pass_at_k(self.val_rows, params))
        return out

    def run(self, stop: StopSignals | None = None) -> Path:
        from tqdm import tqdm

        cfg = self.cfg
        bar = tqdm(
            total=cfg.trainer.total_steps,
            initial=self.step,
            desc=self.algorithm.name,
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
        stop = stop or StopSignals()
        try:
            start_metrics = self._start_metrics()
            if start_metrics:
                trackers.log(start_metrics, self.step)
            val_acc = start_metrics.get("val/accuracy")  # the bar shows the newest
            while self.step < cfg.trainer.total_steps and stop.signal is None:
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
                val_acc = metrics.get("val/accuracy", val_acc)
                bar.set_postfix(
                    reward=f"{metrics['reward/mean']:.3f}",
                    **({"val_acc": f"{val_acc:.3f}"} if val_acc is not None else {}),
                    step_s=f"{metrics['timing_s/step']:.2f}",
                )
                bar.update(1)
            if stop.signal is not None and self.step < cfg.trainer.total_steps:
                self._stop_on(stop.signal)
        finally:
            stop.restore()
            bar.close()
            trackers.close()
        self.report()
        return self.run_dir

    def report(self) -> None:
        """The summary of the run so far (printed, `summary.json`) and its curves (`curves.png`)."""
        newest = checkpoint.find(self.run_dir, "auto", log=lambda *_: None)
        where = (
            f"{newest} (the newest)"
            if newest
            else "none written" + " (trainer.save_every=0)" * (not self.cfg.trainer.save_every)
        )
        write_report(self.run_dir, time.monotonic() - self.started, where, self.cfg.logger.plot, self.log)

    def _stop_on(self, signum: int, workers_gone: bool = False) -> None:
        """A SIGTERM or SIGINT arrived: the step it interrupted is finished; write a checkpoint
        (`trainer.save_on_signal`) unless this step has one, say how to resume, and stop. When the
        signal reached the workers too (sent to the whole process group) and they died within the
        step, the newest checkpoint there is is the one to go on from."""
        cfg, name = self.cfg, signal.Signals(signum).name
        folder = checkpoint.find(self.run_dir, "auto", log=lambda *_: None)
        saved = folder is not None and folder.name == f"step_{self.step}"
        if cfg.trainer.save_on_signal and self.step > 0 and not saved and not workers_gone:
            folder = self.save()
        where = f"checkpoint {folder}" if folder is not None else "no checkpoint"
        when = (
            f"during step {self.step + 1}, which its workers did not finish"
            if workers_gone
            else f"after step {self.step}"
        )
        self.report()
        self.log(
            f"stopped by {name} {when} ({where}); to go on, run the same command with "
            f"trainer.resume=auto run.dir={self.run_dir}"
        )
        raise Stopped(signum)

    def dead_actors(self, timeout_s: float = 10.0) -> list[str]:
        """The names of this run's actors that no longer answer (died, or their node did)."""
        import ray

        groups = [g for g in (self.trainers, self.critics, self.reward_models, self.rollouts) if g is not None]
        dead = []
        for group in groups:
            for rank, worker in enumerate(group.workers):
                try:
                    ray.get(worker.__ray_ready__.remote(), timeout=timeout_s)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    dead.append(f"{group.role} {rank}")
        return dead

    def shutdown(self) -> None:
        self.samples.close()
        if local_ray_died():  # the signal reached Ray's processes too: its actors are gone with them
            return
        if self.reward_pool is not None:
            self.reward_pool.close()
        for group in (self.trainers, self.critics, self.reward_models, self.rollouts):
            if group is not None:
                group.kill()
        if self.placement is not None:
            self.placement.remove()


__all__ = ["Controller"]
