#!/usr/bin/env python3
"""Rollout throughput, side by side in one process, same model and sampling settings:

- `rlpost`: rlpost's `VLLMRolloutEngine.generate` (prompts in, a padded `Batch` with per-token
  log-probs out) vs `raw`: `vllm.LLM.generate` with the same engine arguments and the same
  `SamplingParams` (goal: rlpost >= 0.95 x raw);
- `--lora-rank R`: `merged` (plain weights, what merge mode syncs) vs `adapter` (the same
  engine with `enable_lora` serving a rank-R adapter on every linear layer through `LoRARequest`);
- `--partial`: the engine of async rollouts (`pausable`: vLLM's async scheduling off), its
  throughput against raw, and a partial rollout: one more of its generations, during which the
  model's own weights are loaded again from another thread (as a sync does) part-way through. It
  reports how long the load waited for the generation to pause, what the generation cost with it,
  how many tokens and samples came after it, and whether the samples are those of a generation
  without the load (the same weights: they must be).

Rounds alternate between the engines (median of `--rounds`). Generated tokens are counted from
the outputs. JSON out.

    python3 benchmarks/random_model.py --shape 0.5b --out /tmp/qwen2-0.5b
    python3 benchmarks/bench_rollout.py --model /tmp/qwen2-0.5b --lora-rank 16 --out benchmarks/rollout_h100.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # rlpost runs its engine in-process: so does raw

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provenance import with_provenance  # noqa: E402

from rlpost.rollout.base import SamplingParams  # noqa: E402
from rlpost.rollout.vllm_engine import VLLMRolloutEngine  # noqa: E402


def engine_kwargs(args) -> dict:
    kw = dict(
        model=args.model,
        dtype=args.dtype,
        seed=0,
        skip_tokenizer_init=True,
        logprobs_mode="processed_logprobs",
        max_model_len=args.prompt_len + args.max_tokens,
        enforce_eager=args.eager,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )  # of host memory on the CPU backend
    return kw


def rlpost_engine(args, pausable: bool = False) -> VLLMRolloutEngine:
    """rlpost's engine with the same settings as raw (`pausable`: the engine of async rollouts)."""
    return VLLMRolloutEngine(
        args.model,
        args.dtype,
        "cuda" if torch.cuda.is_available() else "cpu",
        0,
        1,
        seed=0,
        max_model_len=args.prompt_len + args.max_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.eager,
        max_num_seqs=args.max_num_seqs,
        sleep_mode=False,
        pausable=pausable,
    )


def random_adapter(model_path: str, rank: int, folder: str) -> str:
    """A peft adapter with random A and B on every linear layer of the model (shapes from its
    config on the meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlpost.config import LoraConfig
    from rlpost.models.lora import adapter_key, apply_lora, is_lora_name, save_adapter

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    lora = LoraConfig(rank=rank, alpha=2.0 * rank)
    peft_model = apply_lora(model, lora)
    g = torch.Generator().manual_seed(0)
    named = [
        (adapter_key(n), torch.randn(p.shape, generator=g) * 0.01)
        for n, p in peft_model.named_parameters()
        if is_lora_name(n)
    ]
    return str(save_adapter(named, lora, folder, base_model_name_or_path=model_path))


def partial_rollout(engine, model_path: str, prompts, params, after_s: float) -> dict:
    """One generation with a load of the model's own weights from another thread after `after_s`
    seconds, against one without (the same seeds and weights: the same samples)."""
    import threading

    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=engine_dtype(engine)).to(device)
    weights = list(hf.named_parameters())
    plain = engine.generate(prompts, params)
    timing = {}

    def load():
        time.sleep(after_s)
        asked = time.perf_counter()
        with engine.pauser.loading():
            timing["pause_wait_s"] = time.perf_counter() - asked
            engine.load_weights(iter(weights))
            engine.weight_version += 1
            timing["load_s"] = time.perf_counter() - asked - timing["pause_wait_s"]

    before = engine.weight_version
    thread = threading.Thread(target=load)
    t = time.perf_counter()
    thread.start()
    batch = engine.generate(prompts, params)
    took = time.perf_counter() - t
    thread.join()
    mask = batch["response_mask"]
    after = (batch["token_versions"] > before) & mask
    return {
        **timing,
        "load_after_s": after_s,
        "generate_s": took,
        "tokens_after_load_frac": float(after.sum() / mask.sum()),
        "samples_spanning_both": int((after.any(-1) & (~after & mask).any(-1)).sum()),
        "samples": len(batch),
        "same_samples_as_without_the_load": bool(torch.equal(batch["response_ids"], plain["response_ids"])),
        "max_logprob_diff_vs_without": float((batch["rollout_logprobs"] - plain["rollout_logprobs"]).abs().max()),
    }


def engine_dtype(engine) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(engine.manifest[0].dtype, torch.float32)


def count_tokens(outputs) -> int:
    return sum(len(c.token_ids) for o in outputs for c in o.outputs)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.25)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--skip-rlpost", action="store_true", help="only raw (merged) vs adapter")
    ap.add_argument("--partial", action="store_true", help="a load lands part-way through a generation")
    ap.add_argument("--out", default="")
    return ap.parse_args()


def make_inputs(args):
    """Random prompts, rlpost's sampling params and exactly what rlpost's engine asks vLLM for:
    (prompts, params, vLLM's params, vLLM's prompts)."""
    from transformers import AutoConfig
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, min(5000, vocab), (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)
    ]
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=0)
    # exactly what rlpost's engine asks vLLM for
    vparams = [
        VSamplingParams(
            n=args.n,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_tokens=args.max_tokens,
            logprobs=0,
            stop_token_ids=[1],
            detokenize=False,
            seed=params.seed + i * args.n,
        )
        for i in range(len(prompts))
    ]
    tprompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    return prompts, params, vparams, tprompts


def start_engines(args, prompts, params, vparams, tprompts):
    """Every engine of the run, each start timed: ({name: one generation, its token count},
    {name: start seconds}, the engine of async rollouts where `--partial` asks for it, else None)."""
    from vllm import LLM

    t = time.perf_counter()
    raw = LLM(**engine_kwargs(args))
    start_raw = time.perf_counter() - t
    engines = {"raw": lambda: count_tokens(raw.generate(tprompts, vparams, use_tqdm=False))}
    start = {"raw": start_raw}
    if not args.skip_rlpost:
        t = time.perf_counter()
        ours = rlpost_engine(args)
        start["rlpost"] = time.perf_counter() - t
        engines["rlpost"] = lambda: int(ours.generate(prompts, params)["response_mask"].sum())
    pausable = None
    if args.partial and not args.skip_rlpost:  # the engine of async rollouts (no async scheduling)
        pausable = rlpost_engine(args, pausable=True)
        engines["rlpost_pausable"] = lambda: int(pausable.generate(prompts, params)["response_mask"].sum())
    if args.lora_rank:
        engines["adapter"], start["adapter"] = adapter_engine(args, vparams, tprompts)
    return engines, start, pausable


def adapter_engine(args, vparams, tprompts):
    """vLLM serving a random rank-`--lora-rank` adapter: (one generation, its token count; start seconds)."""
    from vllm import LLM
    from vllm.lora.request import LoRARequest

    adapter = random_adapter(args.model, args.lora_rank, tempfile.mkdtemp(prefix="rlpost-lora-"))
    max_rank = min(r for r in (1, 8, 16, 32, 64, 128, 256, 320, 512) if r >= args.lora_rank)  # vLLM's choices
    t = time.perf_counter()
    lora_llm = LLM(**engine_kwargs(args), enable_lora=True, max_lora_rank=max_rank, max_loras=1)
    took = time.perf_counter() - t
    request = LoRARequest("bench", 1, adapter)
    return lambda: count_tokens(lora_llm.generate(tprompts, vparams, use_tqdm=False, lora_request=request)), took


def measure(engines: dict, rounds: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """One warm-up generation of each engine, then `rounds` rounds taking turns: (tokens/s of each
    round, tokens of the last round) per engine."""
    for fn in engines.values():  # warm-up (first-call compilation, allocator)
        fn()
    rates: dict[str, list[float]] = {k: [] for k in engines}
    tokens: dict[str, int] = {}
    for _ in range(rounds):
        for name, fn in engines.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t = time.perf_counter()
            tokens[name] = fn()
            rates[name].append(tokens[name] / (time.perf_counter() - t))
    return rates, tokens


def make_result(args, start: dict, rates: dict, tokens: dict, pausable, prompts, params) -> dict:
    """The JSON: medians and ratios; with `--partial`, the partial rollout is run here, last."""
    med = {k: statistics.median(v) for k, v in rates.items()}
    result = {
        "command": "python3 " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "start_s": start,
        "tokens_per_round": tokens,
        "tokens_per_s_median": med,
        "tokens_per_s_rounds": rates,
    }
    if "rlpost" in med:
        result["rlpost_over_raw"] = med["rlpost"] / med["raw"]
    if args.lora_rank:
        result["merged_over_adapter"] = med["raw"] / med["adapter"]
    if args.partial and not args.skip_rlpost:
        result["pausable_over_raw"] = med["rlpost_pausable"] / med["raw"]
        after_s = 0.4 * tokens["rlpost_pausable"] / med["rlpost_pausable"]
        result["partial"] = partial_rollout(pausable, args.model, prompts, params, after_s)
    return result


def main() -> None:
    args = parse_args()
    prompts, params, vparams, tprompts = make_inputs(args)
    engines, start, pausable = start_engines(args, prompts, params, vparams, tprompts)
    rates, tokens = measure(engines, args.rounds)
    result = with_provenance(make_result(args, start, rates, tokens, pausable, prompts, params))
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
