"""Issue 43: where rlpost's start-up goes on a GPU, part by part, against TRL's vLLM engine.

Each part runs in a fresh process (imports and CUDA's start count, as in a run), one at a time:
  python benchmarks/peers/startup.py engine VARIANT --model M   # vLLM's engine, made as VARIANT says
  python benchmarks/peers/startup.py trainer --model M          # the trainer actor without Ray
  python benchmarks/peers/startup.py ray                        # Ray's start and one GPU actor
Each prints one line `startup {json}` (seconds by phase); startup.sh runs them and collects the lines.

Engine variants, all from rlpost_fast's arguments (benchmarks/peers/peers.sh: recipe smollm2_sums,
rollout.max_num_seqs=512, rollout.kv_cache_gb=8; rlpost.rollout.vllm_engine.engine_kwargs):
  rlpost     as rlpost_fast makes it (sleep mode, no chunked prefill, 192 x 512 tokens a step)
  chunked    chunked prefill on, 8192 tokens a step (the CPU needs it off, not CUDA)
  nosleep    sleep mode off
  both       chunked and nosleep
  v1         rlpost's, on vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0: no start-up JIT of every
             sampling kernel, `warmup_kernels`, which compiled 12-17 s in each of two processes in a row)
  trl        TRL 1.16's colocated engine (trl/generation/vllm_generation.py): 4096 tokens a step,
             chunked prefill on, no sleep, memory share 0.3
Each then generates the step's 512 samples twice (64 random 46-token prompts x 8, 128 tokens) and,
with sleep mode, sleeps and wakes once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback

MAX_MODEL_LEN, SEQS, PROMPT, NEW = 64 + 128, 512, 46, 128


def sample_stacks(path: str, every_s: float = 0.2) -> None:
    """Write the main thread's stack every `every_s` seconds to `path` (one JSON line each: the
    seconds since the start and the innermost 30 frames), from a daemon thread, until the process
    ends: which code the start-up's seconds go to, without a profiler."""
    main, t0 = threading.main_thread().ident, time.monotonic()

    def loop():
        with open(path, "w") as f:
            while True:
                frame = sys._current_frames().get(main)
                if frame is not None:
                    where = traceback.extract_stack(frame)[-30:]
                    stack = ["/".join(s.filename.split("/")[-3:]) + f":{s.lineno}:{s.name}" for s in where]
                    f.write(json.dumps([round(time.monotonic() - t0, 2), stack]) + "\n")
                    f.flush()
                time.sleep(every_s)

    threading.Thread(target=loop, daemon=True).start()


def engine_args(variant: str) -> dict:
    from rlpost.rollout.vllm_engine import engine_kwargs

    rlpost = engine_kwargs("cuda", 0.3, True, 8.0, False, MAX_MODEL_LEN * SEQS, 1, None)
    chunked = {"enable_chunked_prefill": True, "max_num_batched_tokens": 8192}
    trl = {"gpu_memory_utilization": 0.3, "enable_sleep_mode": False, "max_num_batched_tokens": 4096}
    return {
        "rlpost": rlpost,
        "chunked": {**rlpost, **chunked},
        "nosleep": {**rlpost, "enable_sleep_mode": False},
        "both": {**rlpost, **chunked, "enable_sleep_mode": False},
        "v1": rlpost,
        "trl": trl,
    }[variant]


def engine(variant: str, model: str) -> dict:
    t, out = time.monotonic(), {"variant": variant}
    from rlpost.rollout.vllm_engine import prepare_environment

    prepare_environment("cuda", 1)
    if variant == "v1":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    out["import_s"], t = time.monotonic() - t, time.monotonic()
    kwargs = engine_args(variant)
    out["kwargs"] = kwargs
    llm = LLM(
        model=model, dtype="bfloat16", seed=1, skip_tokenizer_init=True, logprobs_mode="processed_logprobs",
        max_model_len=MAX_MODEL_LEN, max_num_seqs=SEQS, **kwargs,
    )  # fmt: skip
    out["engine_s"] = time.monotonic() - t
    import torch

    g = torch.Generator().manual_seed(0)
    prompts = [TokensPrompt(prompt_token_ids=torch.randint(100, 40000, (PROMPT,), generator=g).tolist())]
    for i in range(2):
        params = SamplingParams(n=8, max_tokens=NEW, temperature=1.0, seed=i, logprobs=0, ignore_eos=True)
        t = time.monotonic()
        done = llm.generate(prompts * 64, params, use_tqdm=False)
        out[f"generate{i}_s"] = time.monotonic() - t
        out[f"tokens{i}"] = sum(len(c.token_ids) for r in done for c in r.outputs)
    if kwargs.get("enable_sleep_mode"):
        t = time.monotonic()
        llm.sleep(level=1)
        out["sleep_s"], t = time.monotonic() - t, time.monotonic()
        llm.wake_up()
        out["wake_s"] = time.monotonic() - t
    return out


def trainer(model: str, overrides: list[str]) -> dict:
    t, out = time.monotonic(), {}
    from rlpost.config.compose import load_config
    from rlpost.roles.actor import ActorWorker
    from rlpost.weightsync.transport import free_port

    out["import_s"], t = time.monotonic() - t, time.monotonic()
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    out["cuda_s"], t = time.monotonic() - t, time.monotonic()
    cfg = load_config(["+recipe=smollm2_sums", f"model.path={model}", *overrides])
    out["config_s"], t = time.monotonic() - t, time.monotonic()
    ActorWorker(cfg, model, 0, 1, "127.0.0.1", free_port())
    out["actor_s"] = time.monotonic() - t
    out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def ray_start() -> dict:
    t, out = time.monotonic(), {}
    import ray

    out["import_s"], t = time.monotonic() - t, time.monotonic()
    ray.init(num_gpus=1, include_dashboard=False)
    out["init_s"], t = time.monotonic() - t, time.monotonic()

    @ray.remote(num_gpus=1)
    class Probe:
        def imports(self) -> float:
            s = time.monotonic()
            import rlpost.roles.actor  # noqa: F401

            return time.monotonic() - s

    probe = Probe.remote()
    out["actor_import_s"] = ray.get(probe.imports.remote())
    out["actor_s"] = time.monotonic() - t - out["actor_import_s"]
    ray.shutdown()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=["engine", "trainer", "ray"])
    p.add_argument("variant", nargs="?", default="rlpost")
    p.add_argument("--model", default="")
    p.add_argument("--stacks", default="", help="sample the main thread's stack into this file")
    p.add_argument("--set", action="append", default=[], help="a config override for the trainer (repeat)")
    a = p.parse_args()
    if a.stacks:
        sample_stacks(a.stacks)
    t = time.monotonic()
    if a.part == "engine":
        out = engine(a.variant, a.model)
    elif a.part == "trainer":
        out = trainer(a.model, a.set)
    else:
        out = ray_start()
    out.update(part=a.part, total_s=time.monotonic() - t)
    print("startup " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
