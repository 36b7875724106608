"""Multi-turn episodes: the model and an environment take turns, token in, token out.

An episode is one sequence: the prompt, then the model's tokens exactly as sampled (never decoded
and tokenized again), each turn ended by EOS, interleaved with the environment's answers rendered
through the chat template (`render_suffix`), which get no loss (`loss_mask` False) and no rollout
log-prob. It ends when the environment says so, after `env.max_turns` turns of the model, when
the next turn would not fit in `rollout.max_response_length` tokens (the budget of the whole
episode), or past `env.timeout_s`. On the `hf` backend the turns of all the episodes that wait for
the model are generated together, in one `generate` call per round.

The result is a generation-layout `Batch` like a single-turn one, plus per episode: `env_turns`,
`env_tool_calls`, `env_tool_errors`, `env_timeouts`, `env_reward` (the sum of the turns' rewards)
and `last_turn_start` (where the model's last turn starts in the response: the answer that the
reward function reads).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from rlpost.data.batch import Batch
from rlpost.data.padding import left_pad, right_pad
from rlpost.envs import Environment, Turn
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
    reward: float = 0.0
    last_turn_start: int = 0
    done: bool = False

    def add(self, tokens: list[int], model: bool, logprobs: list[float] | None = None) -> None:
        self.response += tokens
        self.loss += [model] * len(tokens)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(tokens)


def run_episodes(
    engine: RolloutEngine,
    tokenizer,
    prompts: list[list[int]],
    envs: list[Environment],
    params: SamplingParams,
    max_turns: int,
    timeout_s: float,
) -> Batch:
    """`params.n` episodes per prompt (rows i*n .. i*n+n-1 of the batch, as in `generate`), the
    environment of each in `envs`. `params.max_tokens` is each episode's token budget."""
    n, eos, pad = params.n, tokenizer.eos_token_id, tokenizer.pad_token_id
    if len(envs) != len(prompts) * n:
        raise ValueError(f"{len(envs)} environments for {len(prompts)} prompts x {n} episodes")
    episodes = [Episode(env, list(prompts[i // n]), time.monotonic()) for i, env in enumerate(envs)]
    round_ = 0
    while active := [e for e in episodes if not e.done]:
        budget = [params.max_tokens - len(e.response) for e in active]
        out = engine.generate(
            [e.prompt + e.response for e in active],
            replace(params, n=1, max_tokens=max(budget), seed=params.seed + 7919 * round_),
        )
        round_ += 1
        for i, e in enumerate(active):
            mask = out["response_mask"][i]
            tokens = out["response_ids"][i][mask].tolist()[: budget[i]]
            logprobs = out["rollout_logprobs"][i][mask].tolist()[: len(tokens)]
            e.last_turn_start = len(e.response)
            e.add(tokens, True, logprobs)
            e.turns += 1
            if not tokens or tokens[-1] != eos:  # the budget ran out within the turn
                e.done = True
                continue
            step = e.env.step(Turn(tokenizer.decode(tokens, skip_special_tokens=True), tuple(tokens), e.turns - 1))
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
    return episodes_batch(episodes, pad, engine.weight_version)


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
            "env_reward": per(lambda e: e.reward),
            "last_turn_start": per(lambda e: e.last_turn_start, torch.long),
        }
    )
