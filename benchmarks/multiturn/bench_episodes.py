#!/usr/bin/env python3
"""Multi-turn episodes on vLLM: the model's generation speed in episodes with the calculator,
against single-turn generation of the same total lengths, in one process on one engine.

For each tool latency (0, then a random delay per call, as a remote tool has), the episodes run
twice: batched continuously (`rlpost.rollout.vllm_requests.VLLMTurns`: a request per turn,
started as soon as its episode's tool has answered) and in rounds (`RoundTurns`: every waiting
turn in one `generate` call, after every tool of the round has answered). Then the same prompts
are generated in one turn each, with `max_tokens` the length of that episode's whole response
(model and tool tokens) and EOS ignored: the same total length without the turns. Reported: wall
time, model tokens, all tokens, and tokens per second, the median of `--repeats` runs after a
warm-up run.

    python benchmarks/multiturn/bench_episodes.py --model PATH --device cuda --out benchmarks/episodes_h100.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from rlpost.config.schema import EnvConfig
from rlpost.data.tasks import multiply_split
from rlpost.envs import EnvStep, EpisodeRow, Turn, make_env
from rlpost.models.loading import load_tokenizer
from rlpost.rollout.base import SamplingParams
from rlpost.rollout.episodes import run_episodes
from rlpost.rollout.vllm_engine import VLLMRolloutEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from provenance import with_provenance  # noqa: E402


class Delayed:
    """An environment whose steps take a random `0..2*delay_s` seconds longer (a remote tool)."""

    def __init__(self, env, delay_s: float, rng: random.Random):
        self.env, self.tools, self.delay = env, env.tools, 2 * delay_s * rng.random()

    def step(self, turn: Turn) -> EnvStep:
        time.sleep(self.delay)
        return self.env.step(turn)


class InRounds:
    """The engine without `turns`: run_episodes goes round by round."""

    def __init__(self, engine):
        self.engine, self.weight_version = engine, engine.weight_version

    def generate(self, prompts, params):
        return self.engine.generate(prompts, params)


def episodes(engine, tok, rows, n: int, max_tokens: int, delay_s: float, rounds: bool, seed: int) -> dict:
    rng = random.Random(seed)
    envs = [
        Delayed(
            make_env("calculator", EpisodeRow(r["prompt"], r["ground_truth"], r["data_source"]), EnvConfig()),
            delay_s,
            rng,
        )
        for r in rows
        for _ in range(n)
    ]
    prompts = [tok(r["prompt"], add_special_tokens=False).input_ids for r in rows]
    params = SamplingParams(n=n, max_tokens=max_tokens, seed=seed)
    start = time.perf_counter()
    batch = run_episodes(InRounds(engine) if rounds else engine, tok, prompts, envs, params, 4, 600.0, env_workers=64)
    wall = time.perf_counter() - start
    finals = [
        tok.decode(
            batch["response_ids"][i][batch["response_mask"][i]][batch["last_turn_start"][i] :], skip_special_tokens=True
        )
        for i in range(len(batch))
    ]
    right = sum(f.strip() == rows[i // n]["ground_truth"] for i, f in enumerate(finals))
    return {
        "wall_s": wall,
        "model_tokens": int(batch["loss_mask"].sum()),
        "all_tokens": int(batch["response_mask"].sum()),
        "lengths": batch["response_mask"].sum(1).tolist(),
        "turns_mean": batch["env_turns"].mean().item(),
        "tool_calls_mean": batch["env_tool_calls"].mean().item(),
        "success": right / len(batch),
    }


def single_turn(engine, tok, rows, n: int, lengths: list[int], seed: int) -> dict:
    from vllm.inputs import TokensPrompt

    prompts = [tok(r["prompt"], add_special_tokens=False).input_ids for r in rows for _ in range(n)]
    from vllm import SamplingParams as VSamplingParams

    params = [  # no stop token: every response as long as its episode's
        VSamplingParams(max_tokens=length, ignore_eos=True, temperature=1.0, seed=seed + i, detokenize=False)
        for i, length in enumerate(lengths)
    ]
    start = time.perf_counter()
    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"wall_s": wall, "model_tokens": tokens, "all_tokens": tokens}


def median(runs: list[dict]) -> dict:
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "lengths"}
    out["model_tokens_per_s"] = out["model_tokens"] / out["wall_s"]
    out["all_tokens_per_s"] = out["all_tokens"] / out["wall_s"]
    return {k: round(v, 4) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a model folder (the multiturn_tools recipe's tiny model)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--max-model-len", type=int, default=256)
    ap.add_argument("--delay-s", type=float, default=0.05, help="mean tool latency of the second setting")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    tok = load_tokenizer(args.model)
    engine = VLLMRolloutEngine(
        args.model, "float32", args.device, tok.pad_token_id, tok.eos_token_id, 0, args.max_model_len,
        0.3, args.device == "cpu", 256, False,
    )  # fmt: skip
    rows = multiply_split(3, seed=0, num_val=args.prompts)[1]
    result = {
        "command": "python " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
        "episodes": args.prompts * args.n,
        "settings": {},
    }
    for delay in (0.0, args.delay_s):
        setting = {}
        for mode, rounds in (("continuous", False), ("rounds", True)):
            episodes(engine, tok, rows, args.n, args.max_tokens, delay, rounds, seed=99)  # warm-up
            runs = [
                episodes(engine, tok, rows, args.n, args.max_tokens, delay, rounds, seed=s) for s in range(args.repeats)
            ]
            setting[mode] = median(runs)
            if mode == "continuous":
                lengths = runs[0]["lengths"]
                single_turn(engine, tok, rows, args.n, lengths, seed=99)  # warm-up
                setting["single_turn_same_lengths"] = median(
                    [single_turn(engine, tok, rows, args.n, lengths, seed=s) for s in range(args.repeats)]
                )
        c, r, s = setting["continuous"], setting["rounds"], setting["single_turn_same_lengths"]
        setting["continuous_over_rounds"] = round(c["model_tokens_per_s"] / r["model_tokens_per_s"], 3)
        setting["continuous_over_single_turn_all_tokens"] = round(c["all_tokens_per_s"] / s["all_tokens_per_s"], 3)
        result["settings"][f"tool_delay_mean_{delay:g}s"] = setting
        print(json.dumps({f"tool_delay_mean_{delay:g}s": setting}))
    with open(args.out, "w") as f:
        json.dump(with_provenance(result), f, indent=1)


if __name__ == "__main__":
    main()
