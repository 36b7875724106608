"""The single controller: one process that drives the rollout and trainer groups through training.

One step (shared/DESIGN.md): generate -> reward -> old/ref log-probs (from the update's own
forward when the batch trains in one optimizer step: `step.old_logprobs_in_update`) -> advantages
-> update -> weight sync (version + 1) -> metrics, and on schedule validation and checkpoints. The
controller holds no model: it tokenizes, scores, computes advantages and keeps the books. The
actors' start and end are `controller/workers.py`, the run loop `controller/progress.py`, batch
production `controller/rollouts.py`, the sync wiring `controller/weights.py`, the LoRA check
`controller/adapter_probe.py`, the pure parts of a step `controller/step.py`.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import torch

from rlpost.algos.algorithms import ALGORITHMS, needed_roles
from rlpost.algos.filters import BATCH_FILTERS
from rlpost.algos.kl_control import KLController
from rlpost.config import Colocation, TrainConfig
from rlpost.controller import checkpoint
from rlpost.controller.adapter_probe import AdapterProbe
from rlpost.controller.cluster import quiet_libraries
from rlpost.controller.progress import run_steps
from rlpost.controller.run_dir import claim_run_dir
from rlpost.controller.run_lock import release_run_dir
from rlpost.controller.setup import load_data, model_and_base
from rlpost.controller.signals import Stopped, StopSignals
from rlpost.controller.step import (
    batch_metrics,
    check_staleness,
    filter_overlong,
    old_logprobs_in_update,
    plan_padding_fraction,
    put_advantages,
    put_rows,
    sampling_params,
    step_plan,
    timed,
)
from rlpost.controller.workers import Workers
from rlpost.data.batch import Batch
from rlpost.data.microbatch import shard_batch
from rlpost.metrics.summary import write_report
from rlpost.metrics.trackers import SampleLog, trim_logs
from rlpost.models.loading import load_tokenizer


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
        self.run_dir = claim_run_dir(cfg, log, restart=restarts > 0)
        self.samples, self.workers = SampleLog(self.run_dir, cfg.logger.samples_per_step), Workers()
        try:  # from here a failure gives the run folder back (`shutdown`; a closed stdout: cat11's t72)
            log(f"run folder: {self.run_dir}")
            pool = self.workers.pool(cfg)  # a user's reward file runs in it now, before any model is built
            self.model_path, self.base = model_and_base(cfg, self.run_dir, log)  # (with LoRA: its base's fingerprint)
            self.tokenizer = load_tokenizer(self.model_path, cfg.model.trust_remote_code)
            loader, self.val_rows, self.dropped_prompts = load_data(cfg, self.tokenizer, log, self.model_path, pool)
            self.workers.lap("prepare")  # the run folder, the reward pool, the model's files, tokenizer and data
            self.version, self.step = 0, 0
            self.algorithm = ALGORITHMS.get(cfg.algo.name)
            self.keep_groups = BATCH_FILTERS[self.algorithm.batch_filter]
            # the reference lives in the actor's group: a frozen copy, or with LoRA the adapters off
            self.roles = needed_roles(self.algorithm, cfg.algo.kl_coef, reward_model=bool(cfg.reward.model.path))
            log(f"algorithm {self.algorithm.name} ({self.algorithm.paper}): roles {', '.join(self.roles)}")
            self.kl = KLController(cfg.algo.kl_coef, cfg.algo.kl_target, cfg.algo.kl_horizon)
            self.probe = AdapterProbe(cfg.model.lora.rank > 0)
            self.workers.start(cfg, self.roles, self.model_path, self.tokenizer, loader, stop, log)
            self.batches, self.weights = self.workers.batches, self.workers.weights
            w = self.workers
            self.trainers, self.critics, self.rollouts = w.trainers, w.critics, w.rollouts
            if cfg.trainer.resume != "none":
                self._resume()
                self.workers.lap("resume")  # the checkpoint loaded
            trim_logs(self.run_dir, self.step)  # rows of steps this run will write (again) go
            self.sync_weights()  # the rollouts start from exactly the trainer's weights, verified
            self.workers.lap("sync")  # the first sync: the whole model, every tensor checksummed
        except BaseException:
            self.shutdown()  # no actors or placement group outlive a failed start
            raise

    def sync_weights(self) -> dict[str, float]:
        return self.weights.sync(self.version)

    # ---------------------------------------------------------------------------- one step
    def train_step(self) -> dict[str, float]:
        cfg, timing = self.cfg, {}
        scored = self.batches.next_scored(self.step, self.keep_groups, self.version)  # timing_s/gen, reward (, filter)
        self._hand_device("trainer")
        batch = scored.batch
        staleness = check_staleness(batch, self.version, cfg.algo.max_staleness if self.batches.overlap else 0)
        self.samples.write(self.step + 1, scored.rows, cfg.rollout.n, scored.responses, scored.scores.tolist())
        truncated = filter_overlong(batch, cfg, self.tokenizer.eos_token_id)
        lengths, plan = step_plan(batch, cfg)
        probe = self.probe.due(self.step, batch, staleness)
        warming = self.critics is not None and self.step < cfg.critic.warmup_steps  # the policy waits for values
        in_update = old_logprobs_in_update(cfg) and not warming  # else a separate pass brings them first
        if not in_update:
            with timed(timing, "logprob"):
                put_rows(batch, self.trainers.call_sharded("compute_logprobs", shard_batch(batch, plan), probe))
        extra = self._critic_and_advantages(batch, plan, timing)
        actor = {}
        if not warming:
            actor = self._update(batch, plan, probe and in_update, in_update, timing)
            actor.update(self.probe.check(self.step, batch, staleness))
            actor["perf/padding_fraction"] = plan_padding_fraction(lengths, plan)
        sync = self._sync_after_update()
        return {
            **batch_metrics(batch, scored.scores, scored.errors, cfg.rollout.n),
            **scored.metrics,
            **extra,
            "response_length/truncated_frac": truncated / len(batch),
            "reward/shaped_mean": batch["rewards"].mean().item(),
            **actor,
            **sync,
            **timing,
            "rollout/staleness": float(staleness),
            "run/restarts": float(self.restarts),
            "data/dropped_prompts": float(self.dropped_prompts),
        }

    def _critic_and_advantages(self, batch: Batch, plan, timing: dict) -> dict[str, float]:
        """With a critic: its values, then the advantages, then the critic's update; else the advantages."""
        if self.critics is None:
            return put_advantages(batch, self.cfg, self.kl)
        with timed(timing, "values"):
            put_rows(batch, self.critics.call_sharded("compute_values", shard_batch(batch, plan)))
        extra = put_advantages(batch, self.cfg, self.kl)
        with timed(timing, "critic_update"):
            extra.update(self.critics.call_sharded("update", shard_batch(batch, plan))[0])
        return extra

    def _update(self, batch: Batch, plan, probe: bool, in_update: bool, timing: dict) -> dict[str, float]:
        """The policy's update (version + 1); its own forward's log-probs into `batch` when it made them."""
        with timed(timing, "update"):
            results = self.trainers.call_sharded("update", shard_batch(batch, plan), probe, self.step + 1)
        if in_update:
            put_rows(batch, [logprobs for _, logprobs in results])
        self.version += 1
        return results[0][0]

    def _hand_device(self, to: str) -> None:
        """Colocated, the two sides take turns on the devices: to the `trainer` once the step's
        generation is scored (vLLM sleeps), back to the `rollouts` after the update (the trainers
        hand their cached blocks back; vLLM wakes into them as the sync's weights arrive, and its
        KV cache at the next generation)."""
        if not Colocation.of(self.cfg).colocated:
            return
        if to == "trainer":
            self.rollouts.call("sleep")
            return
        for group in self.workers.trained():
            group.call("release_memory")

    def _sync_after_update(self) -> dict[str, float]:
        self._hand_device("rollouts")
        sync = self.sync_weights()  # in the warm-up the same version again: a sleeping vLLM dropped it
        self.batches.synced(self.step + 1)
        return sync

    # ---------------------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        self.probe.rearm()  # check the rollouts' adapter again at the next step
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
        keep = self.cfg.trainer.keep_checkpoints
        return checkpoint.save(self.run_dir, self.step, state, self.workers.trained(), keep, self.base)

    def _resume(self) -> None:
        folder = checkpoint.find(self.run_dir, self.cfg.trainer.resume, self.log)
        if folder is None:
            return self.log(
                f"trainer.resume={self.cfg.trainer.resume}: no complete checkpoint in {self.run_dir}, starting fresh"
            )
        auto = self.cfg.trainer.resume == "auto"  # (a damaged newest one is passed over)
        folder, state = checkpoint.load_intact(folder, self.workers.trained(), auto, self.log)
        self.step, self.version = state["step"], state["version"]
        self.kl.coef = state.get("kl_coef", self.kl.coef)
        self.batches.load_state_dict(state)
        random.setstate(state["python_rng"])
        torch.set_rng_state(state["torch_rng"])
        self.log(f"resumed from {folder} (step {self.step}, weight version {self.version})")

    # ------------------------------------------------------------------------------------ run
    def run(self, stop: StopSignals | None = None) -> Path:
        return run_steps(self, stop)

    def report(self) -> None:
        """The summary of the run so far (printed, `summary.json`) and its curves (`curves.png`)."""
        newest = checkpoint.find(self.run_dir, "auto", log=lambda *_: None)
        none = "none written" + " (trainer.save_every=0)" * (not self.cfg.trainer.save_every)
        where = f"{newest} (the newest)" if newest else none
        write_report(self.run_dir, time.monotonic() - self.started, where, self.cfg.logger, self.log)

    def stop_on(self, signum: int, workers_gone: bool = False) -> None:
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
        unfinished = f"during step {self.step + 1}, which its workers did not finish"
        when = unfinished if workers_gone else f"after step {self.step}"
        self.report()
        go_on = f"to go on, run the same command with trainer.resume=auto run.dir={self.run_dir}"
        again = "nothing to go on from: run it again (here with run.overwrite=true, which replaces its logs)"
        self.log(f"stopped by {name} {when} ({where}); {go_on if folder is not None else again}")  # (cat12's t137)
        raise Stopped(signum)

    def dead_actors(self, timeout_s: float = 10.0) -> list[str]:
        return self.workers.dead_actors(timeout_s)

    def shutdown(self) -> None:
        self.samples.close()
        self.workers.shutdown()
        release_run_dir(self.run_dir)


__all__ = ["Controller"]
