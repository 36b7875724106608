"""The rollout rank: a generation engine plus its end of the weight-sync group.

A plain class; the controller wraps it in a Ray actor, tests call it directly."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager, nullcontext

import torch

from rlpost.config import Colocation, TrainConfig
from rlpost.data.batch import Batch
from rlpost.envs import EpisodeRow, make_env
from rlpost.rollout.base import RolloutEngine, SamplingParams
from rlpost.rollout.episodes import Unmade, run_episodes
from rlpost.weightsync.kinds import sync_kinds
from rlpost.weightsync.manifest import WeightSyncError
from rlpost.weightsync.sync import SyncStats, receive_weights
from rlpost.weightsync.transport import SyncGroup, stacks_if_stuck


def serves_adapter(cfg: TrainConfig) -> bool:
    """model.lora.mode=adapter: the engine holds the base and serves the adapter on top."""
    return cfg.model.lora.rank > 0 and cfg.model.lora.mode == "adapter"


def make_engine(cfg: TrainConfig, model_path: str, rank: int, pad_id: int, eos_id: int) -> RolloutEngine:
    r = cfg.rollout
    lora = cfg.model.lora if serves_adapter(cfg) else None
    if r.backend == "vllm":
        from rlpost.rollout.vllm_engine import VLLMRolloutEngine

        return VLLMRolloutEngine(
            model_path,
            cfg.model.dtype,
            cfg.trainer.device,
            pad_id,
            eos_id,
            seed=cfg.run.seed + rank,
            max_model_len=cfg.data.max_prompt_length + r.max_response_length,
            gpu_memory_utilization=r.gpu_memory_utilization,
            kv_cache_gb=r.kv_cache_gb,
            enforce_eager=r.enforce_eager,
            max_num_seqs=r.max_num_seqs,
            sleep_mode=Colocation.of(cfg).takes_turns,
            trust_remote_code=cfg.model.trust_remote_code,
            lora=lora,
            pausable=cfg.algo.async_rollouts,  # a sync lands between two decoding steps
            tensor_parallel_size=r.tensor_parallel_size,
            verbose=cfg.logger.verbose,  # vLLM's weight-loading bar
        )
    if r.backend == "hf":
        from rlpost.rollout.hf import HFRolloutEngine

        # the varlen kernel serves packed training batches; generation with a KV cache uses sdpa
        attn = "sdpa" if cfg.model.attn_implementation == "rlpost_varlen" else cfg.model.attn_implementation
        return HFRolloutEngine(
            model_path,
            cfg.model.dtype,
            cfg.trainer.device,
            pad_id,
            eos_id,
            cfg.rollout.batch_size,
            attn,
            cfg.model.trust_remote_code,
            lora=lora,
        )
    raise ValueError(f"rollout.backend={r.backend!r} is unknown; choose hf or vllm")


def made_env(e, row: EpisodeRow):
    """The environment of `row` (`env` section `e`), or an `Unmade` that ends its episode."""
    try:
        return make_env(e.name, row, e)
    except (Exception, SystemExit) as error:  # noqa: BLE001  (the user's factory)
        return Unmade(error)


def made_envs(e, rows: list[EpisodeRow], n: int) -> list:
    """`n` environments of each row, made side by side by `env.workers` threads; those not made
    within `env.timeout_s` (an episode's time) are `Unmade`: a slow factory ran once per episode,
    one after another, past every timeout and with nothing said (the twelfth catalogue's t182)."""
    pool = ThreadPoolExecutor(e.workers, thread_name_prefix="rlpost-env-factory")
    futures = [pool.submit(made_env, e, row) for row in rows for _ in range(n)]
    deadline, envs = time.monotonic() + e.timeout_s, []
    for future in futures:
        try:
            envs.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
        except FutureTimeout:
            late = TimeoutError(f"not made within env.timeout_s={e.timeout_s:g} s, an episode's time")
            envs.append(Unmade(late))
    pool.shutdown(wait=False, cancel_futures=True)  # (a factory still running ends on its own)
    return envs


class RolloutWorker:
    def __init__(self, cfg: TrainConfig, model_path: str, rank: int, pad_id: int, eos_id: int, devices=None):
        """`devices`: the GPUs of a colocated tensor-parallel engine (its trainer ranks'), which
        replace the one Ray gave this actor before anything touches CUDA."""
        if devices:
            os.environ["CUDA_VISIBLE_DEVICES"] = devices
        torch.set_num_threads(cfg.cluster.num_threads)
        self.cfg, self.rank, self.model_path = cfg, rank, model_path
        self.engine = make_engine(cfg, model_path, rank, pad_id, eos_id)
        self._tokenizer = None  # multi-turn episodes only: decodes turns, renders the environment's messages
        self.sync_group: SyncGroup | None = None
        self.busy_s = 0.0  # seconds in which a generation call was under way (`_generating`)
        self.life = int.from_bytes(os.urandom(6), "big")  # this actor's, stamped beside busy_s
        self._clock, self._since, self._calls = threading.Lock(), 0.0, 0
        self._one_call = threading.Lock()  # for an engine that takes one generation call at a time
        self.asleep: dict[str, float] = {}  # the device's memory right after the engine last slept (`sleep`)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Batch:
        with self._generating(side_by_side=getattr(self.engine, "concurrent", False)):
            batch = self.engine.generate(prompts, params)
        return self._stamped(batch)

    def run_episodes(self, rows: list[EpisodeRow], prompts: list[list[int]], params: SamplingParams) -> Batch:
        """Multi-turn episodes (`env.name`): `params.n` per prompt, each with its own environment
        made from its row (`rlpost.rollout.episodes`)."""
        with self._generating(side_by_side=False):  # (an episode's turns are its own engine's steps)
            if self._tokenizer is None:
                from rlpost.models.loading import load_tokenizer

                self._tokenizer = load_tokenizer(self.model_path, self.cfg.model.trust_remote_code)
            e = self.cfg.env
            envs = made_envs(e, rows, params.n)
            batch = run_episodes(
                self.engine, self._tokenizer, prompts, envs, params, e.max_turns, e.timeout_s, e.workers
            )
        return self._stamped(batch)

    @contextmanager
    def _generating(self, side_by_side: bool):
        """One generation call: `side_by_side` with others (an engine that shares its steps between
        calls: `concurrent`, async rollouts on vLLM), else one at a time. `busy_s` grows by the time
        in which at least one call was under way (overlapping calls count once)."""
        with nullcontext() if side_by_side else self._one_call:
            with self._clock:
                if not self._calls:
                    self._since = time.perf_counter()
                self._calls += 1
            try:
                yield
            finally:
                with self._clock:
                    now = time.perf_counter()
                    self.busy_s, self._since, self._calls = self.busy_s + now - self._since, now, self._calls - 1

    def _stamped(self, batch: Batch) -> Batch:
        """`batch` with this actor's rank, its life (a restarted actor's differs) and its generation
        seconds so far, this call's included, on every row (`rollout_rank`, `rollout_life`,
        `rollout_busy_s`): the controller's `BusyClock` reads them."""
        rows = batch["response_ids"].shape[0]
        batch["rollout_rank"] = torch.full((rows,), self.rank, dtype=torch.long)
        batch["rollout_life"] = torch.full((rows,), self.life, dtype=torch.long)
        batch["rollout_busy_s"] = torch.full((rows,), self.busy_s, dtype=torch.float64)
        return batch

    def weight_version(self) -> int:
        return self.engine.weight_version

    def init_weight_sync(self, addresses: list[tuple[str, int, int, int]], transport: str) -> None:
        """Join the sync groups: `addresses[shard]` = (host, port, rank, world size), one per shard of
        the engine (one unless it is tensor parallel: then each shard joins in its own process)."""
        device, timeout = self.cfg.trainer.device, self.cfg.weight_sync.timeout_s
        if len(addresses) > 1:
            self.engine.join_sync(addresses, device, timeout, transport)
            return
        host, port, rank, world_size = addresses[0]
        self.sync_group = SyncGroup(host, port, rank, world_size, device, timeout, transport)

    def memory(self) -> dict[str, float]:
        """GPU memory this actor's device has in use (GiB; the whole device, all processes) and
        what torch in this process allocated: a rollout-only actor holds the engine's weights and
        KV cache, never a trainer model."""
        if self.cfg.trainer.device != "cuda":
            return {}
        free, total = torch.cuda.mem_get_info()
        return {
            "rollout/gpu_used_gb": (total - free) / 2**30,
            "rollout/torch_allocated_gb": torch.cuda.memory_allocated() / 2**30,
            "rollout/gpu_total_gb": total / 2**30,
            **self.asleep,
        }

    def sleep(self) -> None:
        """Colocate placement: give the device to the trainer until the next sync or generate."""
        if hasattr(self.engine, "sleep"):
            self.engine.sleep()
            if self.cfg.trainer.device == "cuda":  # what the sleeping engine keeps, before the trainer moves in
                free, total = torch.cuda.mem_get_info()
                self.asleep = {
                    "rollout/asleep_gpu_used_gb": (total - free) / 2**30,
                    "rollout/asleep_torch_reserved_gb": torch.cuda.memory_reserved() / 2**30,
                }

    def receive_weights(self, version: int, kind: str | None = None) -> SyncStats:
        """One sync of `kind` (`rlpost.weightsync.kinds`; default: the whole model, as the first
        sync of a run sends it), and its stats. An adapter sync is checked against the adapter
        this rollout's config implies; every other kind against the base model's parameters."""
        allowed = set(sync_kinds(self.cfg, first=True))
        kind = kind or sync_kinds(self.cfg, first=True)[0]
        if kind not in allowed:
            problem = (
                f"weight sync v{version}: a {kind!r} sync reached a rollout that takes "
                f"{sorted(allowed)} (model.lora.rank={self.cfg.model.lora.rank}, "
                f"mode={self.cfg.model.lora.mode})"
            )
            try:  # refuse inside the protocol (an empty manifest), so the sender stops too
                if self.sync_group is None:  # tensor parallel: each shard refuses
                    self.engine.receive_sharded(version, [])
                else:
                    receive_weights(self.sync_group, [], version, lambda tensors: None, lambda name: None)
            except WeightSyncError:
                pass
            raise WeightSyncError(problem)
        e = self.engine
        if kind == "adapter":
            expected, load, loaded = e.adapter_manifest(), e.load_adapter, e.loaded_adapter_tensor
        else:
            expected, load, loaded = e.weight_manifest(), e.load_weights, e.loaded_tensor
        # (async rollouts: this runs beside a generation, which pauses at its next step meanwhile)
        with stacks_if_stuck(self.cfg.weight_sync.timeout_s / 2), e.pauser.loading():
            if self.sync_group is None:  # tensor parallel: the shards receive (never an adapter: a rule)
                stats = e.receive_sharded(version)
            else:
                stats = receive_weights(self.sync_group, expected, version, load, loaded)
            e.weight_version = version  # what the engine now serves
        return stats

    def loaded_tensors(self, kind: str | None = None) -> dict[str, torch.Tensor | None]:
        """What the engine holds under each name of a sync `kind`'s manifest (None where it keeps
        another layout), on the CPU: for tests and debugging."""
        e = self.engine
        if kind == "adapter":
            names, get = [s.name for s in e.adapter_manifest()], e.loaded_adapter_tensor
        else:
            names, get = [s.name for s in e.weight_manifest()], e.loaded_tensor
        out = {}
        for name in names:
            held = get(name)
            out[name] = None if held is None else held.detach().to("cpu", copy=True)
        return out
