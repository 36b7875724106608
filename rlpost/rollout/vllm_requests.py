"""vLLM's side of a generation request: its sampling settings for rlpost's `SamplingParams`, and the
turns of multi-turn episodes as requests of their own, batched continuously on the engine."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from rlpost.rollout.base import SamplingParams

if TYPE_CHECKING:
    from rlpost.rollout.vllm_engine import VLLMRolloutEngine

REQUESTS = itertools.count()  # request ids of turns, unique in the process


def sampling(params: SamplingParams, n: int, max_tokens: int, seed: int, eos_id: int):
    """vLLM's sampling settings for `params`: the log-prob of each sampled token, stop at EOS."""
    from vllm import SamplingParams as VSamplingParams

    return VSamplingParams(
        n=n,
        temperature=0.0 if params.greedy else params.temperature,
        top_p=1.0 if params.greedy else params.top_p,
        top_k=0 if params.greedy else params.top_k,
        max_tokens=max_tokens,
        logprobs=0,
        stop_token_ids=[eos_id],
        detokenize=False,
        seed=seed,
    )


REQUESTS = itertools.count()  # request ids of turns, unique in the process


class VLLMTurns:
    """Turns of multi-turn episodes on vLLM's engine: a request per turn, added as soon as its
    episode is ready, decoded alongside every other request in flight (continuous batching);
    `step` runs one scheduler step. Turn t of episode k samples with seed `seed + k + 7919 t`,
    whatever the timing."""

    continuous = True

    def __init__(self, engine: VLLMRolloutEngine, params: SamplingParams):
        from vllm.sampling_params import RequestOutputKind

        self.core, self.params, self.eos_id = engine.llm.llm_engine, params, engine.eos_id
        self.pauser = engine.pauser
        self.lora_request, self.final_only = engine.lora_request, RequestOutputKind.FINAL_ONLY
        self.keys: dict[str, int] = {}  # request id -> episode
        self.turn_of: dict[int, int] = {}

    def add(self, key: int, context: list[int], max_tokens: int) -> None:
        from vllm.inputs import TokensPrompt

        turn = self.turn_of.get(key, 0)
        self.turn_of[key] = turn + 1
        params = sampling(self.params, 1, max_tokens, self.params.seed + key + 7919 * turn, self.eos_id)
        params.output_kind = self.final_only  # one output per request, when it finishes
        request_id = f"rlpost-turn-{next(REQUESTS)}"
        assigned = self.core.add_request(
            request_id, TokensPrompt(prompt_token_ids=context), params, lora_request=self.lora_request
        )
        self.keys[request_id] = self.keys[assigned or request_id] = key

    def busy(self) -> bool:
        return self.core.has_unfinished_requests()

    def step(self) -> list[tuple[int, list[int], list[float]]]:
        done = []
        with self.pauser.generating():  # a sync lands between two scheduler steps
            outputs = self.core.step()
        for out in outputs:
            if out.finished:
                c = out.outputs[0]
                tokens = list(c.token_ids)
                done.append((self.keys[out.request_id], tokens, [d[t].logprob for d, t in zip(c.logprobs, tokens)]))
        return done
