"""The `hf` rollout backend: transformers `generate` with a KV cache, the embedded CPU default.

With `lora` (model.lora.mode=adapter) the model is wrapped with peft like the trainer's policy
(`apply_lora`): a base sync loads the base parameters, an adapter sync lora_A/lora_B (held in
float32, as sent), and generation runs base + adapter. Both are read back for verification.

Each decoding step passes a pause point (`Pauser`, through a logits processor that changes
nothing): a weight sync on another thread (`algo.async_rollouts`) lands between two tokens, and
`token_versions` records the version that computed each token's distribution."""

from __future__ import annotations

from typing import Iterator

import torch
from transformers import LogitsProcessor

from rlpost.data.batch import Batch
from rlpost.data.padding import (
    concat_generations,
    generated_responses,
    left_pad,
    response_mask_from_eos,
    token_logprobs,
)
from rlpost.models.loading import load_causal_lm
from rlpost.rollout.base import Pauser, SamplingParams
from rlpost.weightsync.manifest import Manifest, manifest_of


class StepHook(LogitsProcessor):
    """A logits processor that returns the scores unchanged: it notes the version that computed
    them (the token sampled from them is that version's), then lets a waiting sync in."""

    def __init__(self, engine: "HFRolloutEngine", versions: list[int]):
        self.engine, self.versions = engine, versions

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.versions.append(self.engine.weight_version)
        self.engine.pauser.point()
        return scores


class HFRolloutEngine:
    def __init__(
        self,
        model_path: str,
        dtype: str,
        device: str,
        pad_id: int,
        eos_id: int,
        batch_size: int,
        attn_implementation: str = "sdpa",
        trust_remote_code: bool = False,
        lora=None,
    ):
        self.device = torch.device(device)
        model = load_causal_lm(model_path, dtype, attn_implementation, trust_remote_code)
        self.adapter_params: dict[str, torch.nn.Parameter] | None = None
        if lora is not None:
            from rlpost.models.lora import ADAPTER_DTYPE, adapter_named_parameters, apply_lora, base_named_parameters

            model = apply_lora(model, lora)
            self.params = dict(base_named_parameters(model))  # base names, as the trainer sends them
            self.adapter_params = dict(adapter_named_parameters(model))
            for p in self.adapter_params.values():  # (peft's initial A is random, B zero: no effect)
                p.data = p.data.to(ADAPTER_DTYPE)
        else:
            self.params = dict(model.named_parameters())
        self.model = model.to(self.device)
        self.model.eval().requires_grad_(False)
        # what is sampled is rlpost's alone (`SamplingParams`): a folder's generation_config.json (a repetition
        # penalty, banned n-grams, a minimum length) would change the rollout's distribution, not the trainer's
        from transformers import GenerationConfig

        self.model.generation_config = GenerationConfig(
            bos_token_id=model.config.bos_token_id, eos_token_id=eos_id, pad_token_id=pad_id
        )
        self.pad_id, self.eos_id, self.batch_size = pad_id, eos_id, batch_size
        self.weight_version = 0
        self.pauser = Pauser()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Batch:
        torch.manual_seed(params.seed)
        rows = [p for p in prompts for _ in range(params.n)]
        with self.pauser.generating():
            chunks = [
                self._generate_chunk(rows[i : i + self.batch_size], params)
                for i in range(0, len(rows), self.batch_size)
            ]
        return concat_generations(chunks, self.pad_id)

    def _generate_chunk(self, rows: list[list[int]], params: SamplingParams) -> Batch:
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id)
        # explicit values: None would fall back to the model's generation_config (e.g. top_k=50)
        if params.greedy:
            sampling = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        else:
            sampling = {
                "do_sample": True,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k,
            }  # 0 = off
        versions: list[int] = []
        out = self.model.generate(
            input_ids=prompt_ids.to(self.device),
            logits_processor=[StepHook(self, versions)],
            attention_mask=prompt_mask.long().to(self.device),
            max_new_tokens=params.max_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            return_dict_in_generate=True,
            output_scores=True,
            **sampling,
        )
        response_ids = generated_responses(out.sequences, prompt_ids.shape[1]).cpu()
        # the scores each token was sampled from: logits / T, -inf outside top-k / the nucleus
        # (greedy: the raw logits) -> log-probs of the sampled tokens under that distribution
        scores = torch.stack(out.scores, dim=1).float().cpu()
        logprobs = token_logprobs(scores, response_ids)
        response_mask = response_mask_from_eos(response_ids, self.eos_id)
        token_versions = torch.tensor(versions[: response_ids.shape[1]], dtype=torch.long).expand_as(response_ids)
        return Batch(
            {
                "prompt_ids": prompt_ids,
                "prompt_mask": prompt_mask,
                "response_ids": torch.where(response_mask, response_ids, self.pad_id),
                "response_mask": response_mask,
                "loss_mask": response_mask.clone(),  # single-turn: every response token is the model's
                "rollout_logprobs": logprobs * response_mask,
                "weight_version": token_versions[:, 0].clone(),
                "token_versions": token_versions * response_mask,
            }
        )

    def weight_manifest(self) -> Manifest:
        return manifest_of(self.params.items())

    def load_weights(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:  # (the caller holds `pauser.loading()`)
            self.params[name].data.copy_(tensor)

    def loaded_tensor(self, name: str) -> torch.Tensor:
        return self.params[name]

    # ------------------------------------------------------------- adapter (model.lora.mode=adapter)
    def _adapter(self) -> dict[str, torch.nn.Parameter]:
        if self.adapter_params is None:
            raise RuntimeError("this hf engine serves no adapter (built without model.lora, mode=adapter)")
        return self.adapter_params

    def adapter_manifest(self) -> Manifest:
        return manifest_of(self._adapter().items())

    def load_adapter(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        params = self._adapter()
        for name, tensor in named_tensors:
            params[name].data.copy_(tensor)

    def loaded_adapter_tensor(self, name: str) -> torch.Tensor:
        return self._adapter()[name]
