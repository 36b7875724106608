"""vLLM's side of a generation request: its sampling settings for rlpost's `SamplingParams`, samples
decoded by stepping the engine by hand (async rollouts: a sync lands between two steps), and the
turns of multi-turn episodes as requests of their own, batched continuously on the engine."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from rlpost.data.batch import Batch
from rlpost.data.padding import left_pad, right_pad
from rlpost.rollout.base import SamplingParams

if TYPE_CHECKING:
    from rlpost.rollout.vllm_engine import VLLMRolloutEngine

REQUESTS = itertools.count()  # request ids (samples stepped by hand, turns), unique in the process


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


def samples_batch(rows, responses, logprobs, versions, pad_id: int, weight_version: int) -> Batch:
    """One sample a row: prompts left-padded, responses right-padded, each token's log-prob and
    weight version (`weight_version` for a row with no tokens)."""
    prompt_ids, prompt_mask = left_pad(rows, pad_id)
    response_ids, response_mask = right_pad(responses, pad_id)
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
            "weight_version": torch.tensor([v[0] if v else weight_version for v in versions]),
            "token_versions": token_versions,
        }
    )


def generate_stepped(engine: VLLMRolloutEngine, prompts: list[list[int]], params: SamplingParams):
    """(rows, responses, log-probs, token versions) of `engine.pausable` generation: one request
    per sample (sample j of prompt i seeded `seed + i * n + j`, as vLLM seeds the j-th child of a
    request of n), decoded by stepping the engine as `LLM.generate` does: a sync lands between two
    scheduler steps (`engine.pauser`; the requests keep their KV cache and go on with the new
    weights). Where the version changed, the tokens each request had so far are noted: they are
    the older version's."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    core, n = engine.llm.llm_engine, params.n
    rows = [p for p in prompts for _ in range(n)]
    owner: dict[str, int] = {}  # request id -> row
    for k, prompt in enumerate(rows):
        sp = sampling(params, 1, params.max_tokens, params.seed + k, engine.eos_id)
        sp.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it ends
        request_id = f"rlpost-sample-{next(REQUESTS)}"
        assigned = core.add_request(
            request_id, TokensPrompt(prompt_token_ids=prompt), sp, lora_request=engine.lora_request
        )
        owner[request_id] = owner[assigned or request_id] = k
    started = version = engine.weight_version
    switches: list[tuple[int, dict[int, int]]] = []  # (new version, row -> its tokens before it)
    done: dict[int, object] = {}
    while core.has_unfinished_requests():
        with engine.pauser.generating():
            if engine.weight_version != version:  # a sync landed since the last step
                switches.append((engine.weight_version, tokens_so_far(core, owner)))
                version = engine.weight_version
            for out in core.step():
                done[owner[out.request_id]] = out.outputs[0]
    responses = [list(done[k].token_ids) for k in range(len(rows))]
    logprobs = [[d[t].logprob for d, t in zip(done[k].logprobs, responses[k])] for k in range(len(rows))]
    versions = [[started] * len(r) for r in responses]
    for new, before in switches:  # (a row not in flight then had ended: its tokens are older)
        for k, row in enumerate(versions):
            cut = before.get(k, len(row))
            row[cut:] = [new] * (len(row) - cut)
    return rows, responses, logprobs, versions


def tokens_so_far(core, owner: dict[str, int]) -> dict[int, int]:
    """row -> tokens generated so far, of every request in flight: vLLM's output processor holds
    a state per request from `add_request` until it ends."""
    out = {}
    for key, state in core.output_processor.request_states.items():
        ids = (key, getattr(state, "request_id", None), getattr(state, "external_req_id", None))
        row = next((owner[i] for i in ids if i in owner), None)
        if row is not None:
            out[row] = state.detokenizer.num_output_tokens()
    return out


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
