#!/usr/bin/env python3
"""Issue 43: TRL 1.16.0's `GRPOTrainer` on rlpost's `smollm2_sums` task, vLLM colocated.

The task and its settings come from `export_task.py` (`task.json`: rlpost's composed config of the
recipe); the prompts are its training rows in rlpost's batch order (`shuffle_dataset=False`), the
reward is rlpost's own scorer (`sums_reward.py`). What is matched, and how, is commented in
`grpo_config`; what cannot be matched is said there too.

Logged, one JSON object a line, into `--out/trl_log.jsonl` (rank 0):
- `start`: versions, settings, the command;
- `step`: wall time since the process started (`wall_s`), the step's seconds by phase (from TRL's
  own profiling contexts, `trl/extras/profiling.py`: `gen` = vLLM.generate, `weight_sync`,
  `reward`, `logprob` = the no-grad pass for the old log-probs, `prepare` = `_prepare_inputs` in
  all, `update` = the step less `prepare`: forward and backward of the micro-batches, the
  optimizer step), generated tokens and tokens/s of generation, `torch.cuda.max_memory_allocated`
  (this process holds vLLM too: its weights and KV cache are in that figure);
- `val`: held-out greedy accuracy on rlpost's validation rows (vLLM greedy, the current weights
  synced first; `transformers.generate` without vLLM), at step 0 and every `val_every` steps (on N
  GPUs every rank validates the same rows on its own engine, so that no rank's engine waits);
- `trl_log`: TRL's own logged metrics of the step (reward, lengths, grad norm, lr).

One GPU (run with TRL on PYTHONPATH only here: verl must not see it, PLAN.md "Break 2"):
    PYTHONPATH=/tmp/trl_site:/tmp/site:$PWD python3 benchmarks/peers/trl_grpo.py --task /tmp/peers_task \\
        --model /tmp/rlcache/gguf-smollm2-135m-instruct.q4_1-... --out /tmp/runs/trl --steps 20 --seed 0
N GPUs: `torchrun --nproc_per_node N benchmarks/peers/trl_grpo.py ...` (the same 512 completions a step:
`per_device_train_batch_size` = micro-batch / N). CPU check: `--cpu` (no vLLM, tiny sizes given by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sums_reward import STATS, score, trl_reward  # noqa: E402

PHASES = {"vLLM.generate": "gen", "transformers.generate": "gen", "sync_weights": "weight_sync",
          "_calculate_rewards": "reward", "_prepare_inputs": "prepare"}  # fmt: skip
LOGPROB = "_get_per_token_logps_and_entropies"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", required=True, type=Path, help="export_task.py's folder")
    ap.add_argument("--model", required=True, help="the converted SmolLM2 folder (rlpost's resolve_path)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", action="store_true", help="a CPU check: no vLLM, float32")
    ap.add_argument("--prompts", type=int, help="prompts a step (default: the recipe's)")
    ap.add_argument("--max-new", type=int, help="response cap (default: the recipe's)")
    ap.add_argument("--val-rows", type=int, default=0, help="only the first N validation rows (0: all)")
    ap.add_argument("--val-every", type=int, help="default: the recipe's")
    return ap.parse_args(argv)


class Log:
    """`trl_log.jsonl` on rank 0, each row with `wall_s` since this process started."""

    def __init__(self, path: Path, main: bool):
        import psutil

        self.t0 = psutil.Process().create_time()
        self.file = open(path, "a") if main else None

    def write(self, event: str, **row) -> None:
        if self.file:
            self.file.write(json.dumps({"event": event, "wall_s": round(time.time() - self.t0, 3), **row}) + "\n")
            self.file.flush()
            print(f"peers-{event} {json.dumps(row)}"[:400], flush=True)


class PhaseClock:
    """Seconds by phase from TRL's profiling contexts (every `profiling_context` and
    `@profiling_decorator` exit goes through `ProfilingContext._log_metrics`)."""

    def __init__(self):
        from trl.extras import profiling

        self.seconds: dict[str, float] = {}
        original = profiling.ProfilingContext._log_metrics
        clock = self

        def log_metrics(ctx, duration: float) -> None:
            clock.add(ctx.name.split(".", 1)[-1], duration)
            original(ctx, duration)

        profiling.ProfilingContext._log_metrics = log_metrics

    def add(self, name: str, seconds: float) -> None:
        import torch

        if name == LOGPROB:  # the old log-probs run under no_grad; the update's forward does not
            name = "logprob" if not torch.is_grad_enabled() else "update_forward"
        phase = PHASES.get(name, "reward" if name.endswith("reward") else None)
        if phase:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out


def load_task(folder: Path, seed: int):
    """(settings, training rows in rlpost's order for `seed`, validation rows) from export_task.py."""
    record = json.loads((folder / "task.json").read_text())
    read = lambda name: [json.loads(x) for x in (folder / name).read_text().splitlines() if x.strip()]  # noqa: E731
    return record["settings"], read(f"train_s{seed}.jsonl"), read("val.jsonl")


def grpo_config(args, s: dict, world: int):
    """TRL's settings for rlpost's recipe; `s` is task.json's `settings` (rlpost's config)."""
    from trl import GRPOConfig

    prompts, n = args.prompts or s["prompts_per_step"], s["group_size"]
    micro = min(s["micro_batch_size"], prompts * n)  # rlpost: 128 sequences a micro-batch, 4 of them
    vllm = {} if args.cpu else dict(
        use_vllm=True, vllm_mode="colocate",  # vLLM in this process, sharing the GPU with the trainer
        vllm_gpu_memory_utilization=s["gpu_memory_utilization"],  # 0.3, as rlpost's rollout
        vllm_enable_sleep_mode=False,  # TRL's default; rlpost sleeps its engine, verl frees its cache (both
        # matter only for memory, not speed, at 135M: a 0.3 share of an H100 fits beside the trainer)
        vllm_max_model_length=s["max_prompt_length"] + s["max_response_length"],  # 64 + 128, as rlpost
        vllm_importance_sampling_correction=s["rollout_is"] != "none",  # rlpost algo.rollout_is=token:
        vllm_importance_sampling_mode="token_truncate",  # truncated IS per token (TIS), weights
        vllm_importance_sampling_clip_max=s["rollout_is_threshold"],  # min(pi_old / pi_vllm, 2.0)
    )  # fmt: skip
    return GRPOConfig(
        output_dir=str(args.out / "trainer"), seed=args.seed, max_steps=args.steps,
        per_device_train_batch_size=micro // world,  # completions a micro-batch on each GPU
        gradient_accumulation_steps=prompts * n // micro,  # 4 micro-batches: one optimizer step of 512
        # completions, generated at once (steps_per_generation defaults to it: generation_batch_size 512)
        num_generations=n, max_completion_length=args.max_new or s["max_response_length"],
        temperature=s["temperature"], top_p=s["top_p"], top_k=s["top_k"],  # 1.0, 1.0, 0: plain sampling
        shuffle_dataset=False,  # the rows are already in rlpost's batch order for this seed
        learning_rate=s["lr"], weight_decay=s["weight_decay"], adam_beta1=s["betas"][0],
        adam_beta2=s["betas"][1], adam_epsilon=s["adam_eps"], max_grad_norm=s["grad_clip"],
        lr_scheduler_type="constant", warmup_steps=0,  # replaced by rlpost's own warm-up: WarmupTrainer
        beta=s["kl_coef"],  # 0: no KL term, no reference model (rlpost kl_coef 0)
        loss_type="dapo",  # token-mean over all loss tokens of the 512 completions (rlpost token-mean)
        scale_rewards="group",  # (r - group mean) / (group std + 1e-4); rlpost: + 1e-6 (norm_adv_by_std)
        epsilon=s["clip_ratio_low"], epsilon_high=s["clip_ratio_high"],  # 0.2 / 0.2 (no dual clip in
        # TRL; rlpost's clip_ratio_c=3 bounds negative-advantage ratios above 3: never met at ratio 1)
        num_iterations=s["ppo_epochs"],  # one pass over the batch: ratio 1, as rlpost's ppo_epochs 1
        mask_truncated_completions=False, disable_dropout=True,  # (SmolLM2 has no dropout anyway)
        gradient_checkpointing=False,  # TRL's default is True; rlpost and verl (as set) recompute nothing
        model_init_kwargs={"dtype": "float32", "attn_implementation": s["attn_implementation"]},
        bf16=not args.cpu, use_cpu=args.cpu,  # float32 master weights, bf16 autocast (rlpost: FSDP2
        # mixed precision, float32 master, bf16 compute); vLLM runs bf16 (its "auto" downcasts float32)
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, log_completions=False,
        **vllm,
    )  # fmt: skip


def warmup_trainer(warmup_steps: int):
    """GRPOTrainer with rlpost's warm-up: lr x (step + 1) / warmup_steps at optimizer step `step`
    (0-based), then constant (`rlpost/trainer/engine.py` lr_factor). Transformers' own
    constant_with_warmup starts at 0 (step / warmup), a step behind."""
    import torch
    from trl import GRPOTrainer

    class WarmupTrainer(GRPOTrainer):
        def create_scheduler(self, num_training_steps: int, optimizer=None):
            if self.lr_scheduler is None:
                factor = lambda step: min(1.0, (step + 1) / max(warmup_steps, 1))  # noqa: E731
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, factor)
                self._created_lr_scheduler = True
            return self.lr_scheduler

    return WarmupTrainer


def validate(trainer, rows: list[dict], tok, max_new: int) -> float:
    """Held-out greedy accuracy, scored by rlpost's scorer: vLLM on the current weights (synced
    first, so the next step does not sync again), or transformers' generate without vLLM."""
    from rlpost.data.dataset import prompt_ids

    ids = [prompt_ids(r["prompt"], tok, None, "val")[1] for r in rows]
    if getattr(trainer, "use_vllm", False):
        from vllm import SamplingParams

        trainer.vllm_generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step
        params = SamplingParams(temperature=0.0, max_tokens=max_new, n=1)
        outs = trainer.vllm_generation.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
        responses = [list(o.outputs[0].token_ids) for o in outs]
    else:
        responses = hf_greedy(trainer.model, tok, ids, max_new)
    texts = tok.batch_decode(responses, skip_special_tokens=True)
    return sum(score(t, r["ground_truth"], r["data_source"]) >= 1.0 for t, r in zip(texts, rows)) / len(rows)


def hf_greedy(model, tok, ids: list[list[int]], max_new: int, batch: int = 64) -> list[list[int]]:
    """Greedy responses with transformers' generate (left-padded batches), each cut after its eos."""
    import torch

    out, pad = [], tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    was_training = model.training
    model.eval()
    for i in range(0, len(ids), batch):
        chunk = ids[i : i + batch]
        width = max(map(len, chunk))
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in chunk], device=model.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in chunk], device=model.device)
        with torch.no_grad():
            gen = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=pad)  # fmt: skip
        for row in gen[:, width:].tolist():
            out.append(row[: row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row)
    model.train(was_training)
    return out


def peers_callback(log: Log, clock: PhaseClock, val_rows: list[dict], tok, max_new: int, val_every: int):
    """Step rows (phases, tokens/s, memory), validation at step 0 and every `val_every` steps, TRL's logs."""
    import torch
    from transformers import TrainerCallback

    class PeersCallback(TrainerCallback):
        trainer = None

        def on_train_begin(self, args, state, control, **kw):
            self.val(state.global_step)

        def on_step_begin(self, args, state, control, **kw):
            self.start, self.tokens = time.perf_counter(), STATS["completion_tokens"]
            clock.take()

        def on_step_end(self, args, state, control, **kw):
            step_s, phases = time.perf_counter() - self.start, clock.take()
            tokens = STATS["completion_tokens"] - self.tokens
            phases["update"] = step_s - phases.get("prepare", 0.0)
            memory = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
            gen_s = phases.get("gen", 0.0)
            log.write("step", step=state.global_step, step_s=step_s, phases=phases, gen_tokens=tokens,
                      gen_tokens_per_s=tokens / gen_s if gen_s else None, max_allocated_gib=memory)  # fmt: skip
            if val_every and state.global_step % val_every == 0:
                self.val(state.global_step)

        def on_log(self, args, state, control, logs=None, **kw):
            log.write("trl_log", step=state.global_step, **{k: v for k, v in (logs or {}).items() if _num(v)})

        def val(self, step: int) -> None:  # every rank alike (each its own engine, no rank waits), rank 0 logs
            start = time.perf_counter()
            acc = validate(self.trainer, val_rows, tok, max_new)
            log.write("val", step=step, accuracy=acc, val_s=time.perf_counter() - start, rows=len(val_rows))

    return PeersCallback()


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def versions() -> dict:
    import importlib.metadata as md

    found = {}
    for name in ("trl", "transformers", "torch", "vllm", "accelerate", "datasets"):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = None
    return found


def build(args, log: Log):
    """The trainer, its tokenizer and the peers callback, for the task's rows and settings."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    s, train, val = load_task(args.task, args.seed)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = grpo_config(args, s, world)
    tok = AutoTokenizer.from_pretrained(args.model)
    rows = train[: args.steps * (args.prompts or s["prompts_per_step"])]  # the steps' batches, in order
    clock = PhaseClock()
    val_rows = val[: args.val_rows] if args.val_rows else val
    callback = peers_callback(log, clock, val_rows, tok, args.max_new or s["max_response_length"],
                              s["val_every"] if args.val_every is None else args.val_every)  # fmt: skip
    trainer = warmup_trainer(s["warmup_steps"])(
        model=args.model, reward_funcs=trl_reward(tok), args=config, train_dataset=Dataset.from_list(rows),
        processing_class=tok, callbacks=[callback],
    )  # fmt: skip
    callback.trainer = trainer
    log.write("start", versions=versions(), settings=s, world_size=world, command=" ".join(sys.argv),
              config={k: v for k, v in config.to_dict().items() if _num(v) or isinstance(v, str)})  # fmt: skip
    return trainer, tok, train


def check_prompt_ids(trainer, tok, rows: list[dict]) -> int:
    """Prompts whose ids TRL computes (`_tokenize_prompts`) other than rlpost does: 0 expected."""
    from rlpost.data.dataset import prompt_ids

    theirs, _, _ = trainer._tokenize_prompts([r["prompt"] for r in rows])
    return sum(list(t) != prompt_ids(r["prompt"], tok, None, "train")[1] for t, r in zip(theirs, rows))


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "trl_log.jsonl", int(os.environ.get("RANK", "0")) == 0)
    trainer, tok, train = build(args, log)
    log.write("prompt_ids", rows_checked=64, rows_whose_ids_differ=check_prompt_ids(trainer, tok, train[:64]))
    trainer.train()
    import torch

    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    log.write("end", steps=trainer.state.global_step, max_allocated_gib=peak)


if __name__ == "__main__":
    main()
