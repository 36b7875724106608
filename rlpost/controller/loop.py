"""The single controller: one process that drives rollout and trainer groups through GRPO.

One step (see shared/DESIGN.md): generate -> reward -> old/ref log-probs -> advantages ->
update -> weight sync (version + 1) -> metrics, and on schedule validation and checkpoints.
The controller holds no model: it tokenizes, scores, computes advantages and keeps the books.

With LoRA a sync carries merged weights (merge mode), or the base once per run and then only the
adapter (adapter mode). Checksums prove the rollouts hold what the trainer sent, not that what
was sent is the trained policy, nor that the engine applies it (verl #7014: base weights sent
without the adapter; verl #7495: the adapter never reached the rollouts). So the controller also
checks the rollouts' own log-probs: on a batch generated with a non-zero adapter they must be
closer to the trainer's policy than to the base model (`check_rollout_serves_adapter`).
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import torch

from rlpost.algos.advantages import get_advantage
from rlpost.config import ConfigError, TrainConfig, config_dict, mini_batch_size, to_yaml
from rlpost.controller import checkpoint
from rlpost.controller.cluster import Placement, WorkerGroup, get_all, start_ray
from rlpost.data.batch import Batch
from rlpost.data.dataset import DataError, PromptLoader, PromptRow, load_prompts
from rlpost.data.microbatch import padding_fraction, plan_step, shard_batch
from rlpost.data.padding import concat_generations
from rlpost.data.tasks import ARITHMETIC_FORMAT, arithmetic_split, write_jsonl
from rlpost.metrics.trackers import SampleLog, Trackers
from rlpost.models.loading import load_tokenizer, resolve_model_path, start_eval
from rlpost.rewards import REWARDS, RewardInput, get_reward_fn, score_samples
from rlpost.rollout.base import SamplingParams
from rlpost.rollout.worker import RolloutWorker
from rlpost.trainer.lora import sync_kinds
from rlpost.trainer.worker import TrainerWorker


@dataclass
class Pending:
    """A batch whose generation is under way: its prompts and the rollout actors' futures."""
    rows: list[PromptRow]
    refs: list


def group_ids(num_prompts: int, n: int) -> torch.Tensor:
    """[num_prompts * n]: the `n` samples of each prompt are contiguous and share its index."""
    return torch.arange(num_prompts).repeat_interleave(n)


def step_plan(batch: Batch, cfg: TrainConfig):
    """(tokens per row, plan[rank][mini][micro] = row indices): contiguous mini-batches of whole
    prompt groups, each balanced over the trainer ranks by tokens (rlpost.data.microbatch)."""
    lengths = (batch["prompt_mask"].sum(-1) + batch["response_mask"].sum(-1)).tolist()
    plan = plan_step(lengths, cfg.trainer.world_size, cfg.data.train_batch_size // mini_batch_size(cfg),
                     cfg.trainer.max_tokens_per_microbatch, cfg.trainer.micro_batch_size)
    return lengths, plan


def advantages(rewards: torch.Tensor, groups: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """One advantage per sample [N] from its reward and its group (`algo.advantage`)."""
    return get_advantage(cfg.algo.advantage)(rewards, groups, norm_by_std=cfg.algo.norm_adv_by_std)


def sync_plan(cfg: TrainConfig) -> dict[int, list[int]]:
    """Which trainer rank sends the weights to which rollout actors. Over NCCL/gloo rank 0
    broadcasts to all of them; with CUDA IPC (colocate on GPUs) each rank feeds the actors on
    its own GPU (every rank holds the full tensors after FSDP's all-gather)."""
    if sync_transport(cfg) == "ipc":
        plan: dict[int, list[int]] = {}
        for r in range(cfg.rollout.num_workers):
            plan.setdefault(r % cfg.trainer.world_size, []).append(r)
        return plan
    return {0: list(range(cfg.rollout.num_workers))}


def sync_transport(cfg: TrainConfig) -> str:
    return "ipc" if cfg.cluster.placement == "colocate" and cfg.trainer.device == "cuda" else "broadcast"


def check_colocated_memory(cfg: TrainConfig, reports: list[dict[str, float]], margin_gib: float = 1.0) -> None:
    """vLLM takes `rollout.gpu_memory_utilization` of the whole GPU whenever it is awake; the
    trainer keeps its resident memory (weights, Adam states) there all along. Both must fit."""
    gib = 2**30
    for rank, rep in enumerate(reports):
        if cfg.rollout.backend != "vllm" or not rep:
            continue
        total, resident = rep["total"], rep["resident"]
        wanted = cfg.rollout.gpu_memory_utilization * total
        room = total - resident - margin_gib * gib
        if wanted > room:
            raise ConfigError(
                f"rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} asks vLLM for "
                f"{wanted / gib:.1f} GiB of the {total / gib:.1f} GiB GPU of trainer rank {rank}, but the trainer "
                f"keeps {resident / gib:.1f} GiB there between phases (+{margin_gib:.0f} GiB margin): set "
                f"rollout.gpu_memory_utilization<={math.floor(max(room, 0) / total * 100) / 100:.2f}, or free trainer memory with "
                f"trainer.param_offload=true or trainer.optim.offload=layerwise")


def make_run_dir(cfg: TrainConfig) -> Path:
    run_dir = Path(cfg.run.dir or f"runs/{datetime.now():%Y%m%d_%H%M%S}").expanduser().resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return run_dir


def data_sources(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """Train and validation sources; an offline task writes its rows as jsonl first."""
    if cfg.data.task == "arithmetic":
        folder = Path(cfg.model.cache_dir).expanduser() / "data" / \
            f"arithmetic-d{cfg.data.arithmetic_digits}-v{cfg.data.val_size}-f{ARITHMETIC_FORMAT}"
        train, val = arithmetic_split(cfg.data.arithmetic_digits, seed=0, num_val=cfg.data.val_size)
        if not (folder / "val.jsonl").is_file():
            write_jsonl(train, folder / "train.jsonl")
            write_jsonl(val, folder / "val.jsonl")
        return [str(folder / "train.jsonl")], [str(folder / "val.jsonl")]
    return list(cfg.data.train_files), list(cfg.data.val_files)


def check_reward_routing(rows: list[PromptRow], reward_fn: str) -> None:
    """With `reward.fn=auto`, every row's data_source must name a registered reward function:
    fail at start rather than score every sample 0."""
    if reward_fn != "auto":
        return
    unknown = sorted({r.data_source for r in rows} - set(REWARDS))
    if unknown:
        what = "rows without a data_source" if unknown[0] == "" else f"data_source {unknown[0]!r}"
        raise DataError(f"reward.fn=auto has no reward function for {what}; set reward.fn=NAME or "
                        f"path/to/file.py:function, or data.default_data_source=NAME "
                        f"(registered: {sorted(REWARDS)})")


class AdapterNotServedError(RuntimeError):
    """The rollouts generate with the base model, not the trained LoRA policy."""


def check_rollout_serves_adapter(batch: Batch, staleness: int, separation: float = 4.0) -> dict[str, float]:
    """verl #7014 / #7495 guard. `batch` holds, per response token, the rollout's log-probs
    (`rollout_logprobs`), the trainer policy's (`old_logprobs`, base + adapter) and the base
    model's (`ref_logprobs`, adapters disabled). A rollout that serves the adapter is closer to
    the policy than to the base; one that serves the base the other way round.

    Judged only when the two distances are `separation` times apart (before that, e.g. while
    the adapter is still ~0, rollout noise can put either side ahead) and the batch's generator
    had a non-zero adapter: version >= 1 (peft starts B at 0, so version 0 is the base), and for
    a stale batch (one-step-off-policy: the policy moved on since it was generated) version
    >= 1 + staleness, so that the generator's adapter outweighs the updates since. Raises
    `AdapterNotServedError` when the rollout is clearly closer to the base."""
    mask = batch["response_mask"]
    rollout, policy, base = (batch[k][mask].double() for k in ("rollout_logprobs", "old_logprobs", "ref_logprobs"))
    to_policy = (rollout - policy).abs().mean().item() if mask.any() else 0.0
    to_base = (rollout - base).abs().mean().item() if mask.any() else 0.0
    out = {"lora/rollout_vs_policy": to_policy, "lora/rollout_vs_base": to_base,
           "lora/policy_vs_base": (policy - base).abs().mean().item() if mask.any() else 0.0,
           "lora/adapter_check": 0.0}
    version = int(batch["weight_version"].min().item())
    if version < 1 + staleness or max(to_policy, to_base) <= separation * min(to_policy, to_base):
        return out  # not conclusive
    if to_policy > to_base:
        raise AdapterNotServedError(
            f"the rollouts' log-probs (batch of weight version {version}) match the base model without "
            f"the adapter (mean |diff| {to_base:.3g}) better than the trained policy ({to_policy:.3g}): "
            "the adapter does not reach generation (merged weights without it, or an adapter the "
            "engine does not apply; verl #7014, #7495)")
    out["lora/adapter_check"] = 1.0
    return out


class Controller:
    def __init__(self, cfg: TrainConfig, log=print):
        self.cfg, self.log = cfg, log
        self.run_dir = make_run_dir(cfg)
        log(f"run folder: {self.run_dir}")
        self.samples = SampleLog(self.run_dir, cfg.logger.samples_per_step)
        self.model_path = resolve_model_path(cfg.model, cfg.data, cfg.trainer.device, log=log)
        self.tokenizer = load_tokenizer(self.model_path, cfg.model.trust_remote_code)
        self._load_data()
        self.reward_fn = get_reward_fn(cfg.reward.fn)
        self.version, self.step = 0, 0
        self.lora = cfg.model.lora.rank > 0
        self._rollouts_primed = False  # False until a sync brought the whole model (base) over
        self._last_sync_kinds: list[str] = []
        self._adapter_probe_due = self.lora  # check_rollout_serves_adapter at the next chance
        # split placement: batches generate while earlier ones train (one-step-off-policy)
        self.overlap = cfg.cluster.placement == "split" and cfg.algo.max_staleness > 0
        self.pending: deque[Pending] = deque()
        self.placement = self.trainers = self.rollouts = None
        try:
            self._start_workers()
            if cfg.trainer.resume != "none":
                self._resume()
            self._sync_weights()  # the rollouts start from exactly the trainer's weights, verified
        except BaseException:
            self.shutdown()  # no actors or placement group outlive a failed start
            raise

    # ------------------------------------------------------------------------------- set-up
    def _load_data(self) -> None:
        cfg = self.cfg
        train_src, val_src = data_sources(cfg)
        train = load_prompts(train_src, self.tokenizer, cfg.data.max_prompt_length, cfg.data.default_data_source)
        val = load_prompts(val_src, self.tokenizer, cfg.data.max_prompt_length, cfg.data.default_data_source)
        self.dropped_prompts = train.dropped_too_long + val.dropped_too_long
        if self.dropped_prompts:
            self.log(f"dropped {self.dropped_prompts} prompts longer than data.max_prompt_length="
                     f"{cfg.data.max_prompt_length} tokens")
        check_reward_routing(train.rows + val.rows, cfg.reward.fn)
        self.loader = PromptLoader(train.rows, cfg.data.train_batch_size, cfg.run.seed, cfg.data.shuffle)
        self.val_rows = val.rows
        self.log(f"data: {len(train.rows)} training prompts, {len(self.val_rows)} validation prompts")

    def _start_workers(self) -> None:
        cfg = self.cfg
        start_ray(cfg)
        self.placement = Placement.create(cfg)
        ws = cfg.trainer.world_size
        master = self.placement.address_of_bundle(self.placement.trainer_bundles[0])
        self.trainers = WorkerGroup(TrainerWorker, cfg, self.placement, self.placement.trainer_bundles,
                                    "trainer", lambda r: (cfg, self.model_path, r, ws, *master))
        if cfg.cluster.placement == "colocate" and cfg.trainer.device == "cuda":
            # the rollout engines start only once the trainer holds its memory, and must fit beside it
            check_colocated_memory(cfg, self.trainers.call("memory_report"))
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        self.rollouts = WorkerGroup(RolloutWorker, cfg, self.placement, self.placement.rollout_bundles,
                                    "rollout", lambda r: (cfg, self.model_path, r, pad, eos))
        import ray

        calls = []
        for rank, receivers in sync_plan(cfg).items():
            host, port = self.placement.address_of_bundle(self.placement.trainer_bundles[rank])
            world, transport = 1 + len(receivers), sync_transport(cfg)
            calls.append(self.trainers.workers[rank].init_weight_sync.remote(host, port, world, transport))
            calls += [self.rollouts.workers[r].init_weight_sync.remote(host, port, 1 + j, world, transport)
                      for j, r in enumerate(receivers)]
        ray.get(calls)

    # ---------------------------------------------------------------------------- the parts
    def generate(self, rows: list[PromptRow], params: SamplingParams) -> Batch:
        """Prompts split over the rollout actors (groups stay whole), results in prompt order."""
        return self._gather(self._launch(rows, params), len(rows), params.n)

    def _launch(self, rows: list[PromptRow], params: SamplingParams) -> list:
        k = len(self.rollouts)
        per = [rows[i * len(rows) // k:(i + 1) * len(rows) // k] for i in range(k)]
        return [w.generate.remote([r.prompt_ids for r in part], replace(params, seed=params.seed + i))
                for i, (w, part) in enumerate(zip(self.rollouts.workers, per)) if part]

    def _gather(self, refs: list, num_prompts: int, n: int) -> Batch:
        import ray

        batch = concat_generations(ray.get(refs), self.tokenizer.pad_token_id)
        batch["group_ids"] = group_ids(num_prompts, n)
        return batch

    def score(self, rows: list[PromptRow], batch: Batch, n: int):
        """(rewards [N], how many samples failed to score, the decoded responses)."""
        responses = self.tokenizer.batch_decode(
            [ids[m].tolist() for ids, m in zip(batch["response_ids"], batch["response_mask"])],
            skip_special_tokens=True)
        samples = [RewardInput(rows[i // n].prompt_text, text, rows[i // n].ground_truth, rows[i // n].data_source)
                   for i, text in enumerate(responses)]
        result = score_samples(samples, self.reward_fn, self.cfg.reward.kwargs)
        if result.first_error:
            self.log(f"reward errors this step: {result.errors} (first: {result.first_error})")
        return torch.tensor(result.scores, dtype=torch.float32), result.errors, responses

    def _sync_weights(self) -> dict[str, float]:
        """Bring every rollout to the trainer's policy at `self.version`: one verified sync per
        kind (`sync_kinds`: the plain or merged weights; in adapter mode the base once, then the
        adapter only). Metrics: bytes in all and per kind, `weight_sync/adapter_only`, the time the
        receivers spent checking checksums after the data (`weight_sync/recv_verify_s`)."""
        start = time.perf_counter()
        kinds = sync_kinds(self.cfg, first=not self._rollouts_primed)
        out: dict[str, float] = {"weight_sync/bytes": 0.0, "weight_sync/send_s": 0.0, "weight_sync/recv_s": 0.0}
        readback = []
        for kind in kinds:
            recv = self.rollouts.call_async("receive_weights", self.version, kind)
            sent = self.trainers.call_async("push_weights", self.version, kind=kind)
            stats = get_all(recv + sent, first=recv)  # a receiver's error names the tensor
            recv_stats = stats[:len(recv)]
            send_stats = next(s for s in stats[len(recv):] if s)
            out["weight_sync/bytes"] += send_stats.pop("weight_sync/bytes")
            out[f"weight_sync/{kind}_bytes"] = float(recv_stats[0]["weight_sync/recv_bytes"])
            out["weight_sync/send_s"] += send_stats.pop("weight_sync/send_s")
            out["weight_sync/recv_s"] += max(s["weight_sync/recv_s"] for s in recv_stats)
            out["weight_sync/recv_verify_s"] = (out.get("weight_sync/recv_verify_s", 0.0)
                                                + max(s["weight_sync/recv_verify_s"] for s in recv_stats))
            readback += [s["weight_sync/readback_tensors"] for s in recv_stats]
            for key, value in send_stats.items():  # e.g. perf/sync_peak_gb
                out[key] = max(out.get(key, value), value)
            versions = self.rollouts.call("weight_version")
            if versions != [self.version] * len(versions):  # every rollout took this sync
                raise RuntimeError(f"rollout weight versions {versions} after the {kind} sync v{self.version}")
        if self.lora and kinds != self._last_sync_kinds:  # say what travels, when it changes
            self.log(f"weight sync v{self.version}: " + " + ".join(
                f"{k} ({out[f'weight_sync/{k}_bytes'] / 2**20:.2f} MiB)" for k in kinds))
        self._rollouts_primed, self._last_sync_kinds = True, kinds
        return {**out, "weight_sync/version": float(self.version),
                "weight_sync/adapter_only": float(kinds == ["adapter"]),
                "weight_sync/readback_tensors": min(readback),
                "timing_s/weight_sync": time.perf_counter() - start}

    # ---------------------------------------------------------------------------- one step
    def _sampling(self, step: int) -> SamplingParams:
        """Sampling settings of the batch that trains step `step` (seeded by the step)."""
        r = self.cfg.rollout
        return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                              max_tokens=r.max_response_length, seed=self.cfg.run.seed * 1_000_003 + step * 101)

    def _queue_generation(self) -> None:
        """Launch the generation of the next batch not yet launched (it runs on the rollout
        actors with their current weights while the controller goes on)."""
        step = self.step + len(self.pending)
        rows = next(self.loader)
        self.pending.append(Pending(rows, self._launch(rows, self._sampling(step))))

    def train_step(self) -> dict[str, float]:
        cfg, timing = self.cfg, {}
        t = time.perf_counter()
        if not self.pending:
            self._queue_generation()
        job = self.pending.popleft()
        rows = job.rows
        batch = self._gather(job.refs, len(rows), cfg.rollout.n)
        timing["timing_s/gen"] = time.perf_counter() - t  # the wait: less when overlapped
        if self.overlap:  # one-step-off-policy: the next batches generate while this one trains
            while len(self.pending) < cfg.algo.max_staleness and \
                    self.step + 1 + len(self.pending) < cfg.trainer.total_steps:
                self._queue_generation()
        elif cfg.cluster.placement == "colocate":
            self.rollouts.call("sleep")  # the trainer gets the device (vLLM on a GPU)
        staleness = self.version - batch["weight_version"].min().item()
        if staleness > (cfg.algo.max_staleness if self.overlap else 0):
            raise RuntimeError(f"a batch generated by weight version {batch['weight_version'].min().item()} "
                               f"would train version {self.version} (algo.max_staleness={cfg.algo.max_staleness})")

        t = time.perf_counter()
        rewards, reward_errors, responses = self.score(rows, batch, cfg.rollout.n)
        timing["timing_s/reward"] = time.perf_counter() - t
        self.samples.write(self.step + 1, [rows[i // cfg.rollout.n].prompt_text for i in range(len(responses))],
                           responses, rewards.tolist())

        lengths, plan = step_plan(batch, cfg)

        t = time.perf_counter()
        # LoRA: the base model's log-probs too (one more forward, adapters disabled; free when the
        # KL loss needs them anyway) while the rollouts' use of the adapter is to be checked
        probe = self._adapter_probe_due and batch["weight_version"].min().item() >= 1 + staleness
        parts = Batch.cat(self.trainers.call_sharded("compute_logprobs", shard_batch(batch, plan), probe))
        order = torch.argsort(parts["row_index"])  # back to the batch's row order
        for key in ("old_logprobs", "ref_logprobs"):
            if key in parts:
                batch[key] = parts[key][order]
        timing["timing_s/logprob"] = time.perf_counter() - t
        lora_check = {}
        if self.lora and "ref_logprobs" in batch:
            lora_check = check_rollout_serves_adapter(batch, int(staleness))
            if lora_check["lora/adapter_check"]:
                self._adapter_probe_due = False

        batch["advantages"] = advantages(rewards, batch["group_ids"], cfg)

        t = time.perf_counter()
        actor = self.trainers.call_sharded("update", shard_batch(batch, plan))[0]
        timing["timing_s/update"] = time.perf_counter() - t
        actor["perf/padding_fraction"] = sum(padding_fraction(lengths, [rank[m] for rank in plan])
                                             for m in range(len(plan[0]))) / len(plan[0])

        self.version += 1
        if cfg.cluster.placement == "colocate":
            self.trainers.call("release_memory")  # vLLM wakes up into this memory
        sync = self._sync_weights()
        return {**self._batch_metrics(batch, rewards, reward_errors), **actor, **sync, **timing,
                **lora_check, "rollout/staleness": float(staleness)}

    def _batch_metrics(self, batch: Batch, rewards: torch.Tensor, reward_errors: int) -> dict[str, float]:
        mask = batch["response_mask"]
        lengths = mask.sum(-1).float()
        diff = (batch["rollout_logprobs"] - batch["old_logprobs"]).abs()[mask]
        groups = rewards.view(-1, self.cfg.rollout.n)
        return {
            "reward/mean": rewards.mean().item(),
            "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
            "reward/errors": float(reward_errors),
            "reward/uniform_groups": (groups.max(1).values == groups.min(1).values).float().mean().item(),
            "response_length/mean": lengths.mean().item(),
            "response_length/max": lengths.max().item(),
            "rollout/logprob_diff_max": diff.max().item() if diff.numel() else 0.0,
            "rollout/logprob_diff_mean": diff.mean().item() if diff.numel() else 0.0,
            "rollout/weight_version": batch["weight_version"].float().mean().item(),
            "data/dropped_prompts": float(self.dropped_prompts),
            "perf/tokens": float(batch["prompt_mask"].sum() + mask.sum()),
        }

    # ---------------------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        self._adapter_probe_due = self.lora  # check the rollouts' adapter again at the next step
        t = time.perf_counter()
        params = SamplingParams(n=1, temperature=self.cfg.rollout.temperature, top_p=self.cfg.rollout.top_p,
                                top_k=self.cfg.rollout.top_k, max_tokens=self.cfg.rollout.max_response_length,
                                greedy=self.cfg.rollout.val_greedy, seed=self.cfg.run.seed)
        batch = self.generate(self.val_rows, params)
        scores, errors, _ = self.score(self.val_rows, batch, 1)
        return {"val/accuracy": (scores >= 1.0).float().mean().item(), "val/reward_mean": scores.mean().item(),
                "val/reward_errors": float(errors), "val/size": float(len(scores)),
                "timing_s/val": time.perf_counter() - t}

    # ----------------------------------------------------------------------------- checkpoints
    def save(self) -> Path:
        import ray

        # batches generated but not trained yet (one-step-off-policy: by the weights before this
        # step's) are kept, so that a resumed run trains on exactly what this one would have
        pending = [(job.rows, ray.get(job.refs)) for job in self.pending]
        state = {"step": self.step, "version": self.version, "loader": self.loader.state_dict(), "pending": pending,
                 "python_rng": random.getstate(), "torch_rng": torch.get_rng_state()}
        return checkpoint.save(self.run_dir, self.step, state, self.trainers, self.cfg.trainer.keep_checkpoints)

    def _resume(self) -> None:
        folder = checkpoint.find(self.run_dir, self.cfg.trainer.resume)
        if folder is None:
            self.log(f"trainer.resume={self.cfg.trainer.resume}: no complete checkpoint in {self.run_dir}, "
                     "starting fresh")
            return
        state = checkpoint.load(folder, self.trainers)
        self.step, self.version = state["step"], state["version"]
        self.loader.load_state_dict(state["loader"])
        import ray

        self.pending = deque(Pending(rows, [ray.put(part) for part in parts]) for rows, parts in state["pending"])
        random.setstate(state["python_rng"])
        torch.set_rng_state(state["torch_rng"])
        self.log(f"resumed from {folder} (step {self.step}, weight version {self.version})")

    # ------------------------------------------------------------------------------------ run
    def run(self) -> Path:
        from tqdm import tqdm

        cfg = self.cfg
        bar = tqdm(total=cfg.trainer.total_steps, initial=self.step, desc="grpo", dynamic_ncols=True,
                   disable=not cfg.logger.progress_bar)
        trackers = Trackers(cfg.logger.backends, self.run_dir, cfg.logger.project, cfg.logger.wandb_mode,
                            config=config_dict(cfg), write=tqdm.write)
        try:
            start_metrics = {k: v for m in self.rollouts.call("memory") for k, v in m.items()}
            if self.step == 0:  # the built tiny model's held-out greedy accuracy and pass@k
                start_metrics.update({f"start/{k}": float(v) for k, v in start_eval(self.model_path).items()
                                      if k == "greedy_accuracy" or k.startswith("pass@")})
            if cfg.trainer.val_every and self.step == 0:
                start_metrics.update(self.validate())
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
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", step_s=f"{metrics['timing_s/step']:.2f}",
                                **({"val_acc": f"{metrics['val/accuracy']:.3f}"} if "val/accuracy" in metrics else {}))
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
