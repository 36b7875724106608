"""Multi-turn episodes: the model and an environment take turns, token in, token out.

An episode is one sequence: the prompt, then the model's tokens exactly as sampled (never decoded
and tokenized again), each turn ended by EOS, interleaved with the environment's answers rendered
through the chat template (`render_suffix`), which get no loss (`loss_mask` False) and no rollout
log-prob. It ends when the environment says so, after `env.max_turns` turns of the model, when
the next turn would not fit in `rollout.max_response_length` tokens (the budget of the whole
episode), or past `env.timeout_s`.

Turns and environment steps overlap. The environments' steps (tool calls) run in a thread pool,
each episode's as soon as its turn is sampled. An engine with `turns()` (vLLM) batches
continuously: a turn starts as soon as its episode's environment has answered, while other
episodes' turns are being decoded or their tools are still running, so a slow tool holds back
only its own episode. Any other engine (`hf`) goes in rounds: the turns of all the episodes that
wait for the model are generated together, in one `generate` call, once every environment step
of the round has answered (the same batches every time: reproducible).

The result is a generation-layout `Batch` like a single-turn one, plus per episode: `env_turns`,
`env_tool_calls`, `env_tool_errors`, `env_timeouts`, `env_reward` (the sum of the turns' rewards)
and `last_turn_start` (where the model's last turn starts in the response: the answer that the
reward function reads).
"""

from __future__ import annotations

import time
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from rlpost.data.batch import Batch
from rlpost.data.padding import left_pad, right_pad
from rlpost.data.scalars import finite_number
from rlpost.envs import Environment, Turn
from rlpost.envs.base import EnvStep
from rlpost.rollout.base import RolloutEngine, SamplingParams

MARK = "\u2063rlpost-turn\u2063"  # stands in for a model turn when rendering what follows it


def render_suffix(tokenizer, messages: list[dict]) -> list[int]:
    """The tokens the chat template puts after a model turn that ended with EOS: `messages` (tool
    results, feedback) and the next turn's generation prompt. Rendered after a stand-in
    conversation and cut after the stand-in model turn (and its EOS, where the template writes it)."""
    base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": MARK}]
    full = tokenizer.apply_chat_template(base + messages, tokenize=False, add_generation_prompt=True)
    rest = full[full.index(MARK) + len(MARK) :]
    eos = tokenizer.eos_token or ""
    if eos and rest.startswith(eos):
        rest = rest[len(eos) :]
    return tokenizer(rest, add_special_tokens=False).input_ids


@dataclass
class Episode:
    env: Environment
    prompt: list[int]
    started: float
    response: list[int] = field(default_factory=list)
    loss: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    timed_out: bool = False
    errors: int = 0  # steps of its environment that raised (the episode ended there)
    reward: float = 0.0
    last_turn_start: int = 0
    done: bool = False

    def add(self, tokens: list[int], model: bool, logprobs: list[float] | None = None) -> None:
        self.response += tokens
        self.loss += [model] * len(tokens)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(tokens)


class Turns(Protocol):
    """Turns of many episodes in flight on one engine, each keyed by its episode's index."""

    continuous: bool  # a turn may start while others are decoding

    def add(self, key: int, context: list[int], max_tokens: int) -> None: ...

    def busy(self) -> bool: ...

    def step(self) -> list[tuple[int, list[int], list[float]]]:
        """Run the engine on; the turns that finished: (key, tokens as sampled, their log-probs)."""


class RoundTurns:
    """Turns through `engine.generate`: every waiting turn in one call, with a seed per round."""

    continuous = False

    def __init__(self, engine: RolloutEngine, params: SamplingParams):
        self.engine, self.params, self.round = engine, params, 0
        self.queue: list[tuple[int, list[int], int]] = []

    def add(self, key: int, context: list[int], max_tokens: int) -> None:
        self.queue.append((key, context, max_tokens))

    def busy(self) -> bool:
        return bool(self.queue)

    def step(self) -> list[tuple[int, list[int], list[float]]]:
        queue, self.queue = sorted(self.queue), []
        budget = max(m for _, _, m in queue)
        params = replace(self.params, n=1, max_tokens=budget, seed=self.params.seed + 7919 * self.round)
        out = self.engine.generate([context for _, context, _ in queue], params)
        self.round += 1
        done = []
        for i, (key, _, max_tokens) in enumerate(queue):
            mask = out["response_mask"][i]
            tokens = out["response_ids"][i][mask].tolist()[:max_tokens]
            done.append((key, tokens, out["rollout_logprobs"][i][mask].tolist()[: len(tokens)]))
        return done


def run_episodes(
    engine: RolloutEngine,
    tokenizer,
    prompts: list[list[int]],
    envs: list[Environment],
    params: SamplingParams,
    max_turns: int,
    timeout_s: float,
    env_workers: int = 16,
) -> Batch:
    """`params.n` episodes per prompt (rows i*n .. i*n+n-1 of the batch, as in `generate`), the
    environment of each in `envs`. `params.max_tokens` is each episode's token budget; up to
    `env_workers` environment steps run at once."""
    n, eos, pad = params.n, tokenizer.eos_token_id, tokenizer.pad_token_id
    if len(envs) != len(prompts) * n:
        raise ValueError(f"{len(envs)} environments for {len(prompts)} prompts x {n} episodes")
    episodes = [Episode(env, list(prompts[i // n]), time.monotonic()) for i, env in enumerate(envs)]
    version = engine.weight_version  # the first turns' (a sync may land between turns)
    turns: Turns = engine.turns(params) if hasattr(engine, "turns") else RoundTurns(engine, params)
    for i, e in enumerate(episodes):
        turns.add(i, e.prompt, params.max_tokens)
    stepping: dict = {}  # the environment steps under way: future -> episode index
    with ThreadPoolExecutor(env_workers, thread_name_prefix="rlpost-env") as pool:
        while turns.busy() or stepping:
            if turns.busy():
                for i, tokens, logprobs in turns.step():
                    e = episodes[i]
                    e.last_turn_start = len(e.response)
                    e.add(tokens, True, logprobs)
                    e.turns += 1
                    if not tokens or tokens[-1] != eos:  # the budget ran out within the turn
                        e.done = True
                        continue
                    turn = Turn(tokenizer.decode(tokens, skip_special_tokens=True), tuple(tokens), e.turns - 1)
                    stepping[pool.submit(e.env.step, turn)] = i
            if not stepping:
                continue
            if turns.continuous and turns.busy():  # decode on; take the answers that are in
                answered = [f for f in stepping if f.done()]
            else:  # the engine waits for the environments: all of them (rounds), or the first
                answered = wait(stepping, return_when=FIRST_COMPLETED if turns.continuous else ALL_COMPLETED).done
            for future in sorted(answered, key=stepping.get):
                i = stepping.pop(future)
                e = episodes[i]
                if (step := answer(future, e, episodes)) is None:
                    continue
                e.reward += step.reward
                e.tool_calls += step.tool_calls
                e.tool_errors += step.tool_errors
                e.timed_out = time.monotonic() - e.started > timeout_s
                if step.done or e.turns >= max_turns or e.timed_out:
                    e.done = True
                    continue
                suffix = render_suffix(tokenizer, step.messages)
                if len(e.response) + len(suffix) >= params.max_tokens:  # no room for another turn
                    e.done = True
                    continue
                e.add(suffix, False)
                turns.add(i, e.prompt + e.response, params.max_tokens - len(e.response))
    return episodes_batch(episodes, pad, version)


def answer(future, e: Episode, episodes: list[Episode]):
    """The environment's step for episode `e`, or None when it raised or returned no `EnvStep`: the
    episode ends there, counted in `errors` (the first of the batch said on the console)."""
    try:
        step = future.result()
        problem = step_problem(step)
        if problem is None:
            step.reward = finite_number(step.reward)  # (a numpy scalar: a float)
            return step
    except (Exception, SystemExit, KeyboardInterrupt) as error:  # noqa: BLE001  (the user's environment: counted,
        if isinstance(error, KeyboardInterrupt) and not (future.done() and future.exception() is error):
            raise  # (a signal to this process, not the environment's own: cat12's t147, cat11's t35 for sys.exit)
        problem = f"raised {error!r}"
    e.errors, e.done = e.errors + 1, True
    if not any(other.errors for other in episodes if other is not e):
        print(f"warning: env.step {problem} in an episode: it ends there (env/errors counts)")
    return None


class Unmade:
    """In place of an environment its factory failed to make for a row (it raised: the rollout
    actor died, the error hidden behind "a Ray worker died": the eleventh catalogue's t38): its
    episode ends at its first step, counted in `env/errors`, the factory's error said."""

    tools: list = []

    def __init__(self, error: BaseException):
        self.error = error

    def step(self, turn):
        raise RuntimeError(f"(env.name's factory raised {self.error!r} for this episode's row)")


def step_problem(step) -> str | None:
    """What is wrong with an environment's answer, or None. A None ended the episode without a word;
    a string reward (cat9's n49) or a string message (cat10's t37) killed the rollout actor; a NaN
    reward skipped the step's update, blamed on the rewards' size (cat9's n48)."""
    if not isinstance(step, EnvStep):
        return f"returned {step!r} ({type(step).__name__}), not an EnvStep"
    if finite_number(step.reward) is None:
        return f"returned a reward of {step.reward!r} ({type(step.reward).__name__}), not a finite number"
    if not (
        isinstance(step.done, bool) or type(step.done).__name__ == "bool_"
    ):  # a string ended every episode at its first turn (cat11's t33)
        return f"returned done={step.done!r} ({type(step.done).__name__}), not True or False"
    messages = step.messages if isinstance(step.messages, list) else [step.messages]
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), (str, list))):
            return (  # (content None was an empty tool turn, no error counted: cat21's t128b)
                f"returned a message {m!r} ({type(m).__name__}); each of EnvStep.messages is a dict "
                "{'role': ..., 'content': ...} whose content is text (or a list of parts)"
            )
    return None


def episodes_batch(episodes: list[Episode], pad_id: int, weight_version: int) -> Batch:
    prompt_ids, prompt_mask = left_pad([e.prompt for e in episodes], pad_id)
    response_ids, response_mask = right_pad([e.response for e in episodes], pad_id)
    width = response_ids.shape[1]
    loss_mask, _ = right_pad([e.loss for e in episodes], False, width, torch.bool)
    logprobs, _ = right_pad([e.logprobs for e in episodes], 0.0, width, torch.float32)
    per = lambda f, dtype=torch.float32: torch.tensor([f(e) for e in episodes], dtype=dtype)  # noqa: E731
    return Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "loss_mask": loss_mask,
            "rollout_logprobs": logprobs * loss_mask,
            "weight_version": torch.full((len(episodes),), weight_version, dtype=torch.long),
            "env_turns": per(lambda e: e.turns),
            "env_tool_calls": per(lambda e: e.tool_calls),
            "env_tool_errors": per(lambda e: e.tool_errors),
            "env_timeouts": per(lambda e: e.timed_out),
            "env_errors": per(lambda e: e.errors),
            "env_reward": per(lambda e: e.reward),
            "last_turn_start": per(lambda e: e.last_turn_start, torch.long),
        }
    )
