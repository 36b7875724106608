#!/usr/bin/env python3
"""The start model's headroom on a task, before any training: greedy accuracy, pass@k of k
samples at temperature 1, and response lengths, on the task's validation rows, scored by the
task's reward (the same rows, chat template and reward a run uses). One JSON line per setting.

    python benchmarks/real_model/headroom.py --model smollm2-135m-instruct --device cpu \
        --task sums_steps --set data.operands=4 data.arithmetic_digits=2 --problems 64 --k 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--task", required=True)
    p.add_argument("--set", nargs="*", default=[], help="data.KEY=VALUE overrides of the task")
    p.add_argument("--problems", type=int, default=128)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/rlpost"))
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--reward", default="", help="a registered reward instead of each row's data_source")
    p.add_argument("--kv-cache-gb", type=float, default=4.0, help="sized, not profiled: runs may share the GPU")
    return p.parse_args()


def load(a):
    """The task's validation rows (the first `--problems`), the tokenizer and a vLLM engine of the model."""
    from rlpost.config import load_config
    from rlpost.controller.setup import data_sources
    from rlpost.data.dataset import load_prompts
    from rlpost.models.loading import load_tokenizer, resolve_path
    from rlpost.rollout.vllm_engine import VLLMRolloutEngine

    overrides = [
        f"model.path={a.model}",
        f"data.task={a.task}",
        f"model.cache_dir={a.cache}",
        "data.max_prompt_length=512",
    ]
    cfg = load_config(overrides + a.set)
    path = resolve_path(a.model, a.cache)
    tok = load_tokenizer(path)
    _, val_src = data_sources(cfg)
    rows = load_prompts(val_src, tok, 512).rows[: a.problems]
    engine = VLLMRolloutEngine(
        path,
        "bfloat16" if a.device == "cuda" else "float32",
        a.device,
        tok.pad_token_id,
        tok.eos_token_id,
        seed=0,
        max_model_len=1024 + a.max_tokens,
        gpu_memory_utilization=0.3,
        enforce_eager=a.device == "cpu",
        max_num_seqs=256,
        sleep_mode=False,
        kv_cache_gb=a.kv_cache_gb,
    )
    return rows, tok, engine


def verdicts(engine, tok, rows, params, reward: str):
    """Every row's `params.n` answers: (texts, right or not, response lengths, seconds)."""
    from rlpost.rewards import RewardInput, get_reward_fn

    prompts = [r.prompt_ids for r in rows]
    t = time.time()
    batch = engine.generate(prompts, params)
    texts, right, lengths = [], [], []
    for i in range(len(batch)):
        m = batch["response_mask"][i]
        ids = batch["response_ids"][i][m].tolist()
        text = tok.decode(ids, skip_special_tokens=True)
        row = rows[i // params.n]
        fn = get_reward_fn(reward or row.data_source)
        right.append(fn(RewardInput(row.prompt_text, text, row.ground_truth, row.data_source)) >= 1.0)
        texts.append(text)
        lengths.append(len(ids))
    return texts, right, lengths, time.time() - t


def main() -> None:
    a = parse_args()
    from rlpost.metrics.passk import pass_at_ks
    from rlpost.rollout.base import SamplingParams

    rows, tok, engine = load(a)
    greedy = SamplingParams(n=1, max_tokens=a.max_tokens, greedy=True)
    g_texts, g_right, g_len, g_s = verdicts(engine, tok, rows, greedy, a.reward)
    sampled = SamplingParams(n=a.k, temperature=a.temperature, max_tokens=a.max_tokens, seed=1)
    s_texts, s_right, s_len, s_s = verdicts(engine, tok, rows, sampled, a.reward)
    per = [s_right[i * a.k : (i + 1) * a.k] for i in range(len(rows))]
    out = {
        "task": a.task,
        "set": a.set,
        "problems": len(rows),
        "k": a.k,
        "temperature": a.temperature,
        "reward": a.reward or rows[0].data_source,
        "greedy_accuracy": sum(g_right) / len(rows),
        **pass_at_ks(per, [k for k in (1, 2, 4, 8, 16) if k <= a.k]),
        "greedy_length_mean": sum(g_len) / len(g_len),
        "sample_length_mean": sum(s_len) / len(s_len),
        "sample_length_max": max(s_len),
        "truncated_share": sum(n >= a.max_tokens for n in s_len) / len(s_len),
        "seconds": round(g_s + s_s, 1),
        "example_prompt": rows[0].prompt_text,
        "example_greedy": g_texts[0],
        "example_sample": s_texts[0],
    }
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
