"""Build the tiny model: `model.path=tiny` resolves to a folder in `model.cache_dir` holding a
Qwen2-style model and a character tokenizer, built and warm-started on the run's offline task
(`data.task`: arithmetic, or calculator episodes of the multiply task) the first time and reused
afterwards, with the start model's held-out greedy accuracy and pass@k (`start_eval.json`). The
folder is written under a temporary name and renamed when complete, so an interrupted build is
never mistaken for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from rlpost.models.loading import load_tokenizer, resolve_path


def tiny_task(data_cfg) -> str:
    """The offline task the tiny model is warmed up on: the run's, or arithmetic for user files."""
    return data_cfg.task or "arithmetic"


def tiny_model_dir(model_cfg, data_cfg) -> Path:
    """Cache folder of the tiny model for these settings (content-addressed)."""
    from rlpost.data.tasks import ARITHMETIC, task_format

    task = tiny_task(data_cfg)
    unused = "warmup_carry_slip" if task != ARITHMETIC else "warmup_tool_share"  # (another task's knob)
    spec = {
        "tiny": {k: v for k, v in asdict(model_cfg.tiny).items() if k != unused},
        "digits": data_cfg.arithmetic_digits,
        "val_size": data_cfg.val_size,
        "format": 2,
        "task_format": task_format(task),
    }
    if task != ARITHMETIC:  # (the arithmetic model's folder name is kept as it was)
        spec["task"] = task
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return Path(model_cfg.cache_dir).expanduser() / f"tiny-qwen2-{digest}"


START_EVAL = "start_eval.json"  # the built model's held-out greedy accuracy and pass@k


def ensure_tiny_model(model_cfg, data_cfg, device: str = "cpu", log=print, describe: bool = True) -> Path:
    """Build, warm up, evaluate and cache the tiny model unless a complete copy is cached already,
    and (`describe`) say its start evaluation. On `cuda` the build runs in a child process, so that
    this one holds no CUDA context."""
    final = tiny_model_dir(model_cfg, data_cfg)
    if not (final / "config.json").is_file():
        check_writable(final.parent, "model.cache_dir")  # before the minutes of warm-up, not after
        log(f"building the tiny model into {final} (first run only)")
        if device == "cuda":
            import multiprocessing

            child = multiprocessing.get_context("spawn").Process(
                target=build_tiny_model, args=(model_cfg, data_cfg, final, device)
            )
            child.start()
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"building the tiny model on {device} failed (exit code {child.exitcode})")
        else:
            build_tiny_model(model_cfg, data_cfg, final, device, log)
    missing = [name for name in ("model.safetensors", START_EVAL) if not (final / name).is_file()]
    if missing:  # (the fifteenth catalogue's t31, t32: a cache clean-up; the actors died loading it, or a KeyError)
        raise CacheError(
            f"model.path=tiny: the built model in {final} has no {' or '.join(missing)} (removed since it was built): "
            "delete that folder and it is built again"
        )
    if describe:
        log(describe_start(final))
    return final


class CacheError(FileNotFoundError):
    """The cache folder cannot take the files a run would write there (the message names its key)."""


def check_writable(folder: Path, key: str) -> None:
    """`folder` (made if missing) must take a new file, else a `CacheError` that names `key`."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write_probe_{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise CacheError(
            f"{key}: cannot write into {folder} ({e.strerror}); set {key} to a folder you can write"
        ) from None


def untrained_tiny(model_cfg, data_cfg):
    """(the tiny model with its seed's initial weights, its character tokenizer)."""
    from transformers import Qwen2ForCausalLM

    from rlpost.data.tasks import MULTIPLY
    from rlpost.tiny.model import TOOL_CHARS, build_char_tokenizer, tiny_qwen2_config

    t = model_cfg.tiny
    torch.manual_seed(t.seed)
    tokenizer = build_char_tokenizer(extra_chars=TOOL_CHARS if tiny_task(data_cfg) == MULTIPLY else "")
    sizes = (t.hidden_size, t.num_layers, t.num_heads, t.num_kv_heads, t.intermediate_size, t.max_position)
    config = tiny_qwen2_config(len(tokenizer), *sizes, tokenizer.pad_token_id, tokenizer.eos_token_id)
    return Qwen2ForCausalLM(config), tokenizer


def build_tiny_model(model_cfg, data_cfg, final: Path, device: str = "cpu", log=print) -> None:
    """A Qwen2-style model and character tokenizer, warmed up on the run's offline task: arithmetic
    by a sloppy teacher (`model.tiny.warmup_carry_slip`), or multiply by a teacher that calls the
    calculator on a share of the problems (`model.tiny.warmup_tool_share`); then measured on the
    held-out problems (`START_EVAL`), written to a temporary folder and renamed to `final` when
    complete."""
    from rlpost.data.tasks import MULTIPLY, carry_slip, task_split
    from rlpost.tiny.warmup import answer_example, calculator_trace, warm_up

    t, task = model_cfg.tiny, tiny_task(data_cfg)
    start = time.time()
    model, tokenizer = untrained_tiny(model_cfg, data_cfg)
    model.to(device)
    train_rows, val_rows = task_split(task, data_cfg.arithmetic_digits, data_cfg.val_size)
    if task == MULTIPLY:
        example = lambda row, rng: calculator_trace(tokenizer, row, rng, t.warmup_tool_share)  # noqa: E731
    else:
        example = lambda row, rng: answer_example(tokenizer, carry_slip(row, rng, t.warmup_carry_slip))  # noqa: E731
    threads = torch.get_num_threads()
    torch.set_num_threads(t.warmup_threads)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    try:
        warm_up(model, tokenizer, train_rows, t.warmup_steps, t.warmup_batch_size, t.warmup_lr, t.seed, example, log)
        warmup_s = time.time() - start
        if task == MULTIPLY:  # episodes with the calculator, through the rollout engine
            model.to("cpu").save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            report = evaluate_start_episodes(str(tmp), val_rows, t.eval_samples, t.max_position, t.seed)
        else:
            report = evaluate_start(model, tokenizer, val_rows, t.eval_samples, data_cfg.arithmetic_digits + 2, t.seed)
    finally:
        torch.set_num_threads(threads)
    report.update(
        {
            "warmup_s": round(warmup_s, 1),
            "eval_s": round(time.time() - start - warmup_s, 1),
            "device": device,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
    )
    save_built(final, model, tokenizer, START_EVAL, report)
    log(f"tiny model ready ({report['parameters'] / 1e6:.2f}M parameters, {time.time() - start:.0f}s)")


def save_built(final: Path, model, tokenizer, report_name: str, report: dict) -> None:
    """A built model, its tokenizer and its report, written under a temporary name and renamed to
    `final` when complete (an interrupted build is never mistaken for a finished one)."""
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    try:
        model.to("cpu").save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / report_name).write_text(json.dumps(report, indent=1) + "\n")
    except Exception as e:  # a full disk: OSError, or safetensors' own error (the fifteenth catalogue's t56)
        shutil.rmtree(tmp, ignore_errors=True)
        why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise CacheError(f"model.cache_dir: writing the built model into {final.parent} failed ({why}); free space "
                         "there or set model.cache_dir") from None  # fmt: skip
    try:
        tmp.rename(final)
    except OSError:  # another process finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)


def evaluate_start(model, tokenizer, rows: list[dict], samples: int, max_tokens: int, seed: int) -> dict:
    """Held-out greedy accuracy and pass@k (k = 1, 2, 4, ... up to `samples`, sampled at
    temperature 1) of the model, scored by the task's reward function."""
    from rlpost.metrics.passk import pass_at_ks
    from rlpost.rewards import RewardInput, get_reward_fn
    from rlpost.tiny.warmup import sample_answers

    def right(text: str, row: dict) -> bool:
        reward = get_reward_fn(row["data_source"])
        return reward(RewardInput(row["prompt"], text, row["ground_truth"], row["data_source"])) >= 1.0

    prompts = [r["prompt"] for r in rows]
    greedy = sample_answers(model, tokenizer, prompts, 1, max_tokens, greedy=True)
    sampled = sample_answers(model, tokenizer, prompts, samples, max_tokens, greedy=False, seed=seed)
    correct = [[right(text, row) for text in texts] for texts, row in zip(sampled, rows)]
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= samples]
    return {
        "problems": len(rows),
        "samples": samples,
        "greedy_accuracy": sum(right(g[0], row) for g, row in zip(greedy, rows)) / len(rows),
        **pass_at_ks(correct, ks),
    }


def evaluate_start_episodes(path: str, rows: list[dict], samples: int, max_position: int, seed: int) -> dict:
    """Held-out greedy success and pass@k of the model at `path` on episodes with the calculator
    (`env.name=calculator` with the `env` section's defaults), the last turn scored by the task's
    reward."""
    from types import SimpleNamespace

    from rlpost.envs import EpisodeRow, make_env
    from rlpost.metrics.passk import pass_at_ks
    from rlpost.rewards import RewardInput, get_reward_fn
    from rlpost.rollout.base import SamplingParams
    from rlpost.rollout.episodes import run_episodes
    from rlpost.rollout.hf import HFRolloutEngine

    options = SimpleNamespace(
        tool_parser="hermes", tool_timeout_s=10.0, workers=16, tool_memory_mb=4096, max_turns=4, timeout_s=300.0
    )
    tokenizer = load_tokenizer(path)
    engine = HFRolloutEngine(path, "float32", "cpu", tokenizer.pad_token_id, tokenizer.eos_token_id, 2048)
    prompts = [tokenizer(r["prompt"], add_special_tokens=False).input_ids for r in rows]
    budget = max_position - max(len(p) for p in prompts)

    def successes(n: int, greedy: bool) -> list[list[bool]]:
        envs = [
            make_env("calculator", EpisodeRow(r["prompt"], r["ground_truth"], r["data_source"]), options)
            for r in rows
            for _ in range(n)
        ]
        params = SamplingParams(n=n, max_tokens=budget, greedy=greedy, seed=seed)
        batch = run_episodes(engine, tokenizer, prompts, envs, params, options.max_turns, options.timeout_s)
        right = []
        for i in range(len(batch)):
            response = batch["response_ids"][i][batch["response_mask"][i]][batch["last_turn_start"][i] :]
            row = rows[i // n]
            answer = RewardInput(
                row["prompt"],
                tokenizer.decode(response, skip_special_tokens=True),
                row["ground_truth"],
                row["data_source"],
            )
            right.append(get_reward_fn(row["data_source"])(answer) >= 1.0)
        return [right[j * n : (j + 1) * n] for j in range(len(rows))]

    greedy = successes(1, greedy=True)
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= samples]
    return {
        "problems": len(rows),
        "samples": samples,
        "greedy_accuracy": sum(g[0] for g in greedy) / len(rows),
        **pass_at_ks(successes(samples, greedy=False), ks),
    }


def start_eval(model_path: str) -> dict:
    """The built tiny model's `START_EVAL` report, or {} for any other model."""
    path = Path(model_path) / START_EVAL
    return json.loads(path.read_text()) if path.is_file() else {}


def describe_start(folder: Path) -> str:
    e = start_eval(str(folder))
    passes = ", ".join(f"{k} {v:.3f}" for k, v in e.items() if k.startswith("pass@"))
    return (
        f"start model, held-out ({e['problems']} problems, {e['samples']} samples each): greedy accuracy "
        f"{e['greedy_accuracy']:.3f}; {passes}"
    )


def resolve_model_path(model_cfg, data_cfg, device: str = "cpu", log=print, describe: bool = True) -> str:
    """A local folder or hub id; `tiny` builds (once) and returns the tiny model's folder, on
    `device` (`cuda` only where this process sees a GPU), its start evaluation said (`describe`)."""
    if model_cfg.path == "tiny":
        device = "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"
        return str(ensure_tiny_model(model_cfg, data_cfg, device, log=log, describe=describe))
    return resolve_path(model_cfg.path, model_cfg.cache_dir, log)
