"""vLLM's side of a generation request: its sampling settings for rlpost's `SamplingParams`, samples
decoded by stepping the engine by hand (async rollouts: a sync lands between two steps), and the
turns of multi-turn episodes as requests of their own, batched continuously on the engine."""

from __future__ import annotations

import itertools
import queue
import threading
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
    request of n), decoded by stepping the engine as `LLM.generate` does, alongside the requests of
    the other calls under way (`SharedSteps`). A sync lands between two scheduler steps
    (`engine.pauser`; the requests keep their KV cache and go on with the new weights); the tokens
    each request had then are the older version's."""
    rows = [p for p in prompts for _ in range(params.n)]
    settings = [sampling(params, 1, params.max_tokens, params.seed + k, engine.eos_id) for k in range(len(rows))]
    done, started, switches = engine.steps.generate(rows, settings, engine.lora_request, -1 if params.ahead else 0)
    responses = [list(d.token_ids) for d in done]
    logprobs = [[d.logprobs[i][t].logprob for i, t in enumerate(r)] for d, r in zip(done, responses)]
    versions = [[started] * len(r) for r in responses]
    for new, before in switches:  # (a request not in flight then had ended: its tokens are older)
        for k, row in enumerate(versions):
            cut = before.get(k, len(row))
            row[cut:] = [new] * (len(row) - cut)
    return rows, responses, logprobs, versions


class SharedSteps:
    """The requests of every stepped generation under way on one engine. A rollout actor runs up
    to `rlpost.controller.stream.DEPTH` generation calls at once (async rollouts), so the next
    call's requests fill the batch while the last, longest samples of the call before decode:
    no call waits out another's tail. One thread of its own steps the engine (vLLM's CPU kernels
    keep per-thread state from one step to the next: steps taken by the calls' threads in turn
    failed a check on it). A call's requests wait in `inbox`; that thread admits them, runs the
    scheduler steps for all calls and completes each call whose requests have all ended
    (`results`, `ended`). Where a sync landed between two steps, each request's tokens so far are
    noted (`switches`: (new version, (call, row) -> tokens))."""

    def __init__(self, engine: VLLMRolloutEngine):
        self.engine, self.core = engine, engine.llm.llm_engine
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # (call, rows, settings, LoRA request, priority)
        self.calls: dict[int, tuple[list[str], int, int]] = {}  # call -> (its requests, start version, first switch)
        self.left: dict[int, int] = {}  # call -> its requests not ended
        self.ours: dict[str, tuple[int, int]] = {}  # request id (vLLM's outputs name it) -> (call, row), in flight
        self.done: dict[tuple[int, int], object] = {}  # (call, row) -> its final output
        self.switches: list[tuple[int, dict[tuple[int, int], int]]] = []
        self.version = engine.weight_version  # the version the last step ran with
        self.ended: dict[int, threading.Event] = {}
        self.results: dict[int, tuple] = {}  # call -> (outputs, start version, its switches), or the error
        self.wake, self.thread, self.starting = threading.Event(), None, threading.Lock()
        self.threads = torch.get_num_threads()  # the engine's maker's: the stepping thread takes it

    def generate(self, rows: list[list[int]], settings: list, lora_request, priority: int = 0):
        """Each row's final output once all have ended, the version they started with, and the
        switches while they ran (request keyed by its row). A lower `priority` is scheduled before
        the requests already waiting (vLLM's priority policy)."""
        call = next(REQUESTS)
        ended = self.ended[call] = threading.Event()
        self.inbox.put((call, rows, settings, lora_request, priority))
        with self.starting:  # (two first calls at once would start two)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="rlpost-vllm-steps", daemon=True)
                self.thread.start()
        self.wake.set()
        while not ended.wait(1.0):
            if not self.thread.is_alive():  # (it hands its errors to the calls: this is a bug)
                raise RuntimeError("rlpost's vLLM stepping thread ended while a generation waited for it")
        del self.ended[call]
        result = self.results.pop(call)
        if isinstance(result, BaseException):
            raise result
        return result

    def _run(self) -> None:
        """The stepping thread: admit, step while any call is under way, else wait for one. Its
        OpenMP threads are those of the thread that made the engine (a new thread's default differs:
        vLLM's CPU attention then failed its check of the threads its step was planned for)."""
        torch._C.set_num_threads(self.threads)  # (vLLM's CPU worker replaces torch.set_num_threads)
        while True:
            self.wake.wait()
            self.wake.clear()
            try:
                self._admit()
                while self.calls:
                    if not self.core.has_unfinished_requests():
                        raise RuntimeError(f"vLLM's engine lost the requests of {len(self.calls)} calls")
                    self._step()
                    self._admit()
            except Exception as e:  # each call under way raises it in its own thread
                self.core.abort_request(list(self.ours))
                self.ours.clear()
                self.done.clear()
                for call in list(self.calls):
                    del self.calls[call], self.left[call]
                    self.results[call] = e
                    self.ended[call].set()

    def _admit(self) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        while not self.inbox.empty():
            call, rows, settings, lora_request, priority = self.inbox.get()
            if not self.calls:  # nothing in flight: no switch to note
                self.version = self.engine.weight_version
            ids = []
            try:
                for k, (prompt, sp) in enumerate(zip(rows, settings)):
                    sp.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it ends
                    key = f"rlpost-sample-{next(REQUESTS)}"
                    prompt = TokensPrompt(prompt_token_ids=prompt)
                    self.core.add_request(key, prompt, sp, lora_request=lora_request, priority=priority)
                    self.ours[key] = (call, k)
                    ids.append(key)
            except Exception as e:  # vLLM refused a request (too long, say): that call raises it, the others go on
                self.core.abort_request(ids)
                for key in ids:
                    del self.ours[key]
                self.results[call] = e
                self.ended[call].set()
                continue
            self.calls[call], self.left[call] = (ids, self.engine.weight_version, len(self.switches)), len(ids)
            if not ids:
                self._complete(call)

    def _step(self) -> None:
        with self.engine.pauser.generating():
            if self.engine.weight_version != self.version:  # a sync landed since the last step
                self.switches.append((self.engine.weight_version, self._tokens_so_far()))
                self.version = self.engine.weight_version
            for out in self.core.step():
                call, row = self.ours.pop(out.request_id)
                self.done[call, row] = out.outputs[0]
                self.left[call] -= 1
                if not self.left[call]:
                    self._complete(call)

    def _complete(self, call: int) -> None:
        """Hand `call` its outputs and switches, and wake it."""
        ids, started, first = self.calls.pop(call)
        del self.left[call]
        mine = [(v, {k: n for (c, k), n in t.items() if c == call}) for v, t in self.switches[first:]]
        self.results[call] = [self.done.pop((call, k)) for k in range(len(ids))], started, mine
        if not self.calls:
            self.switches.clear()
        self.ended[call].set()

    def _tokens_so_far(self) -> dict[tuple[int, int], int]:
        """(call, row) -> tokens generated so far, of every request in flight: vLLM's output
        processor holds a state per request from `add_request` until it ends."""
        out = {}
        for key, state in self.core.output_processor.request_states.items():
            names = (key, getattr(state, "request_id", None), getattr(state, "external_req_id", None))
            row = next((self.ours[i] for i in names if i in self.ours), None)
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
