"""A run's actors from start to end: the placement group, the worker groups of every role (trainer,
critic, reward model, rollout), the reward pool, batch production and the weight sync between
them. `Workers.start` brings them up in the order memory needs (`engines_wait`: colocated on GPUs,
trainers first, so that the plan and the memory check see what they hold before vLLM profiles what
is left; else side by side); `shutdown` ends
whatever was started, also after a start that failed part-way."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlpost.config import Colocation, TrainConfig
from rlpost.controller.cluster import WorkerGroup, local_ray_died, start_ray
from rlpost.controller.placement import Placement
from rlpost.controller.plan import check_plan, gpu_plan, shape_of
from rlpost.controller.rollouts import Rollouts
from rlpost.controller.setup import resolve_critic_path, resolve_reward_model_path, reward_pool
from rlpost.controller.stream import DEPTH
from rlpost.controller.weights import WeightSync, check_colocated_memory, merge_memory
from rlpost.rewards.pool import RewardPool
from rlpost.roles.actor import ActorWorker
from rlpost.roles.critic import CriticWorker
from rlpost.roles.reward_model import RewardModelWorker
from rlpost.rollout.worker import RolloutWorker


def rollout_groups(cfg: TrainConfig) -> dict[str, tuple[int, tuple[str, ...]]]:
    """The rollout actors' Ray concurrency groups (async rollouts): name -> (calls at once, methods).
    - `control`: what the controller calls while they generate, beside the generation. In the
      actor's queue it would wait for every generation call submitted before it: `memory`, read
      after each GPU step, held async runs to the synchronous pace that way
      (benchmarks/real_model/async_h200x4.json).
    - `generate` (vLLM, whose engine shares its steps between calls; other engines take the calls
      one at a time, in the order they came): the stream's units queued on an actor (`DEPTH`) run
      side by side, the next unit's samples filling the batch while the last, longest samples of
      the one before decode. One slot more for a validation, which then never waits for
      a unit to end (its samples go first: `SamplingParams.ahead`); a validation step cost async
      runs 18-34 s against 10-15 s one-step-off (benchmarks/real_model/async_h200x4b.json)."""
    if not cfg.algo.async_rollouts:
        return {}
    control = {"control": (1, ("receive_weights", "memory"))}
    return control | ({"generate": (DEPTH + 1, ("generate",))} if cfg.rollout.backend == "vllm" else {})


def engines_wait(cfg: TrainConfig) -> bool:
    """Whether the rollout engines start only once the trainers answered. Colocated on GPUs, vLLM
    sizes its KV cache by profiling the memory it finds free, which the trainers' loading would
    change under it; with `rollout.kv_cache_gb` set it does not profile, and split engines have
    GPUs of their own: those start beside the trainers (as every engine does on the CPU)."""
    fixed_cache = cfg.rollout.backend == "vllm" and cfg.rollout.kv_cache_gb > 0
    return Colocation.of(cfg).takes_turns and not fixed_cache


@dataclass
class Workers:
    placement: Placement | None = None
    trainers: WorkerGroup | None = None
    critics: WorkerGroup | None = None
    reward_models: WorkerGroup | None = None
    rollouts: WorkerGroup | None = None
    reward_pool: RewardPool | None = None
    batches: Rollouts | None = None
    weights: WeightSync | None = None
    start_s: dict[str, float] = field(default_factory=dict)  # the start-up's phases (`lap`), logged at step 0
    lapped: float = field(default_factory=time.monotonic)

    def lap(self, phase: str) -> None:
        """`time/start_{phase}_s`: the seconds since the previous lap (the first: since the workers were made)."""
        now = time.monotonic()
        self.start_s[f"time/start_{phase}_s"], self.lapped = now - self.lapped, now

    def pool(self, cfg: TrainConfig) -> RewardPool:
        """The run's reward pool (`reward_pool`), made once: the first try of a user's reward function
        (before the actors) runs in it, so the function's file runs once a worker, not once more."""
        if self.reward_pool is None:
            self.reward_pool = reward_pool(cfg)
        return self.reward_pool

    def start(self, cfg: TrainConfig, roles, model_path: str, tokenizer, loader, stop, log) -> None:
        """Every actor of `roles`, in place (a failure leaves what started for `shutdown`). A signal
        from here on stops the start at its waits' next look, each second (`StopSignals.check`)."""
        if stop is not None:
            stop.before_start, stop.starting = False, True
        start_ray(cfg, log)
        if stop is not None:  # over Ray's own SIGTERM handler, which aborts the process
            stop.install()
        poll = stop.check if stop is not None else None
        self.placement = p = Placement.create(cfg, roles, poll=poll)
        self.lap("ray")  # Ray and the placement group
        ws, master = cfg.trainer.world_size, p.address_of_bundle(p.trainer_bundles[0])
        args = lambda r: (cfg, model_path, r, ws, *master)  # noqa: E731
        self.trainers = WorkerGroup(ActorWorker, cfg, p, p.trainer_bundles, "trainer", args, log, poll=poll)
        if "critic" in roles:  # its own process group (an address and port of its own), on the trainer's bundles
            critic_path, critic_master = resolve_critic_path(cfg, model_path), p.address_of_bundle(p.trainer_bundles[0])
            args = lambda r: (cfg, critic_path, r, ws, *critic_master)  # noqa: E731
            self.critics = WorkerGroup(CriticWorker, cfg, p, p.trainer_bundles, "critic", args, log, poll=poll)
        if "reward_model" in roles:  # one per trainer rank, on its device
            rm_path = resolve_reward_model_path(cfg, model_path, log)
            args = lambda r: (cfg, rm_path, r)  # noqa: E731
            self.reward_models = WorkerGroup(
                RewardModelWorker, cfg, p, p.trainer_bundles, "reward_model", args, log, poll=poll
            )
        wait = engines_wait(cfg)
        if wait:
            self._check_memory(cfg, model_path, log)
            self.lap("trainers")  # they answered: their models loaded
        pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        devices = p.engine_devices(cfg, self.trainers)  # colocated tensor parallel: the shards' GPUs
        self.rollouts = WorkerGroup(
            RolloutWorker,
            cfg,
            p,
            p.rollout_bundles,
            "rollout",
            lambda r: (cfg, model_path, r, pad, eos, devices[r]),
            log,
            groups=rollout_groups(cfg),
            poll=poll,
        )
        if cfg.trainer.device == "cuda" and not wait:  # the engines load while the trainers' answers are awaited
            self._check_memory(cfg, model_path, log)
            self.lap("trainers")
        self.batches = Rollouts(cfg, self.rollouts, loader, pad, tokenizer, self.pool(cfg), log, self.reward_models)
        if stop is not None:  # a first SIGTERM stops a step's slow scoring, not only after it (cat7's s60)
            self.batches.interrupted = lambda: stop.signal is not None
        self.weights = WeightSync(cfg, p, self.trainers, self.rollouts, log)
        self.lap("engines")  # the rollout engines up (on the CPU every actor) and the sync's process groups joined
        if stop is not None:
            stop.check()  # a signal after the start's last wait
            stop.starting = False
        for group in self.groups():  # started: the steps' waits need no look each second
            group.deadlines = replace(group.deadlines, poll=None)

    def _check_memory(self, cfg: TrainConfig, model_path: str, log) -> None:
        """What the trainer-side actors hold, against the colocated engines' share and the plan."""
        groups = [*self.trained(), *([self.reward_models] if self.reward_models else [])]
        reports = [group.call("memory_report") for group in groups]
        if Colocation.of(cfg).takes_turns:
            check_colocated_memory(cfg, [merge_memory(per_rank) for per_rank in zip(*reports)])
        if Path(model_path, "config.json").is_file():  # the plan, for this GPU (`rlpost plan`)
            check_plan(cfg, gpu_plan(cfg, shape_of(cfg, model_path), reports[0][0]["total"]), log)

    def trained(self) -> list[WorkerGroup]:
        """The worker groups whose weights train (and are checkpointed)."""
        return [g for g in (self.trainers, self.critics) if g is not None]

    def groups(self) -> list[WorkerGroup]:
        return [g for g in (self.trainers, self.critics, self.reward_models, self.rollouts) if g is not None]

    def dead_actors(self, timeout_s: float = 10.0) -> list[str]:
        """The names of the actors that no longer answer (died, or their node did)."""
        import ray

        dead = []
        for group in self.groups():
            for rank, worker in enumerate(group.workers):
                try:
                    ray.get(worker.__ray_ready__.remote(), timeout=timeout_s)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    dead.append(f"{group.role} {rank}")
        return dead

    def shutdown(self) -> None:
        if local_ray_died():  # the signal reached Ray's processes too: its actors are gone with them
            return
        if self.reward_pool is not None:
            self.reward_pool.close()
        for group in self.groups():
            group.kill()
        if self.placement is not None:
            self.placement.remove()
