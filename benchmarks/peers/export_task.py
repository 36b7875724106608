#!/usr/bin/env python3
"""Issue 43: the task `rlpost train +recipe=smollm2_sums` trains, written out for TRL and verl.

The rows come from rlpost's own code path: `data_sources` writes the task's rows (the `sums_chat`
task, `rlpost/data/chat_tasks.py`), `read_rows` and `check_row` read them back as a run does, and
rlpost's `PromptLoader` (seeded by `run.seed`) draws the training batches. The training rows are
written in the order that loader draws them for `--seed`, `--steps` batches of
`data.train_batch_size` prompts: TRL (`shuffle_dataset=False`) and verl (`data.shuffle=False`) read
them in file order, so step k of all three frameworks trains the same 64 prompts. The validation
rows are rlpost's held-out rows, in its order.

Written into `--out`:
- `train_s{SEED}.jsonl`, `val.jsonl`: rlpost's row format (`prompt` as chat messages,
  `ground_truth`, `data_source`); TRL reads these (and rlpost could: `data.train_files`).
- `train_s{SEED}.parquet`, `val.parquet`: verl's RLHFDataset layout (verl 0.9.1,
  `verl/utils/dataset/rl_dataset.py` and `examples/data_preprocess/gsm8k.py`): `data_source`,
  `prompt` (chat messages; verl applies the chat template), `ability`, `reward_model`
  (`{"style": "rule", "ground_truth": ...}`) and `extra_info` (`{"index", "split"}`).
- `task.json` and `task.env`: the recipe's settings every framework is given (one source: rlpost's
  composed config), a digest of the rows, and the seed.

The chat template is applied by each framework from the same tokenizer; `--check-tokenizer MODEL`
compares rlpost's prompt token ids (`rlpost.data.dataset.prompt_ids`) with what TRL and verl compute
(`tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)`).

    python benchmarks/peers/export_task.py --out /tmp/peers_task --seed 0 [--steps 122] [--check-tokenizer DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RECIPE = ["+recipe=smollm2_sums"]


def rlpost_config(overrides: list[str]):
    """rlpost's composed config of the recipe (`this_machine=False`: no GPU needed to read it)."""
    from rlpost.config import load_config

    return load_config([*RECIPE, *overrides], this_machine=False)


def rlpost_rows(cfg) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows) exactly as `rlpost train` reads them: the task's cached jsonl,
    each row through `check_row` (the same dict a run keeps, before tokenizing)."""
    from rlpost.controller.setup import data_sources
    from rlpost.data.dataset import check_row, read_rows

    train_src, val_src = data_sources(cfg)
    read = lambda sources: [check_row(r, f"{s}: row {i}") for s in sources for i, r in enumerate(read_rows(s))]  # noqa: E731
    return read(train_src), read(val_src)


def loader_order(rows: list[dict], cfg, seed: int, steps: int) -> list[dict]:
    """The training rows in the order rlpost's loader draws them with `run.seed=seed`: `steps`
    batches of `data.train_batch_size` (an epoch drops its incomplete last batch and the next
    epoch is reshuffled, as in a run)."""
    from rlpost.data.dataset import PromptLoader

    loader = PromptLoader(rows, cfg.data.train_batch_size, seed, cfg.data.shuffle)
    return [row for _ in range(steps) for row in next(loader)]


def settings(cfg) -> dict:
    """What every framework is given, read from rlpost's config of the recipe."""
    r, t, a, o = cfg.rollout, cfg.trainer, cfg.algo, cfg.trainer.optim
    return {
        "prompts_per_step": cfg.data.train_batch_size,
        "group_size": r.n,
        "max_prompt_length": cfg.data.max_prompt_length,
        "max_response_length": r.max_response_length,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k,
        "lr": o.lr,
        "warmup_steps": o.warmup_steps,
        "lr_schedule": o.lr_schedule,
        "weight_decay": o.weight_decay,
        "betas": list(o.betas),
        "adam_eps": o.eps,
        "grad_clip": o.grad_clip,
        "kl_coef": a.kl_coef,
        "entropy_coef": a.entropy_coef,
        "clip_ratio_low": a.clip_ratio_low,
        "clip_ratio_high": a.clip_ratio_high,
        "clip_ratio_c": a.clip_ratio_c,
        "loss_agg_mode": a.loss_agg_mode,
        "norm_adv_by_std": a.norm_adv_by_std,
        "ppo_epochs": a.ppo_epochs,
        "rollout_is": a.rollout_is,
        "rollout_is_threshold": a.rollout_is_threshold,
        "micro_batch_size": t.micro_batch_size,
        "val_every": t.val_every,
        "val_greedy": r.val_greedy,
        "dtype": cfg.model.dtype,
        "attn_implementation": cfg.model.attn_implementation,
        "gpu_memory_utilization": r.gpu_memory_utilization,
        "model": cfg.model.path,
    }


def digest(rows: list[dict]) -> str:
    """sha256 of the rows' prompts and answers, in order (equal digests: the same rows)."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps([row["prompt"], row["ground_truth"], row["data_source"]], sort_keys=True).encode())
    return h.hexdigest()


def verl_row(row: dict, index: int, split: str) -> dict:
    """One row in verl's RLHFDataset layout (`reward_model.ground_truth` is what its reward manager
    passes to `compute_score`; `data_source` names the scorer, as in rlpost)."""
    return {
        "data_source": row["data_source"],
        "prompt": row["prompt"],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": row["ground_truth"]},
        "extra_info": {"index": index, "split": split},
    }


def write_rows(rows: list[dict], out: Path, stem: str, split: str) -> None:
    """`stem.jsonl` (rlpost's format) and `stem.parquet` (verl's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(out / f"{stem}.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps({k: row[k] for k in ("prompt", "ground_truth", "data_source")}) + "\n")
    pq.write_table(pa.Table.from_pylist([verl_row(r, i, split) for i, r in enumerate(rows)]), out / f"{stem}.parquet")


def env_lines(values: dict, seed: int, steps: int) -> str:
    """`task.env`: the settings as shell variables `TASK_*` (verl_grpo.sh sources it)."""
    keys = {f"TASK_{k.upper()}": v for k, v in values.items() if not isinstance(v, (list, dict))}
    keys.update(TASK_SEED=seed, TASK_STEPS_EXPORTED=steps)
    return "".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}\n" for k, v in keys.items())


def export(out: Path, seed: int, steps: int | None, overrides: list[str]) -> dict:
    """Write the task's files into `out` (`steps` batches; None: one epoch); returns task.json's record."""
    cfg = rlpost_config([f"run.seed={seed}", *overrides])
    train, val = rlpost_rows(cfg)
    steps = steps or len(train) // cfg.data.train_batch_size
    ordered = loader_order(train, cfg, seed, steps)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(ordered, out, f"train_s{seed}", "train")
    write_rows(val, out, "val", "val")
    values = settings(cfg)
    record = {
        "recipe": RECIPE[0],
        "overrides": overrides,
        "seed": seed,
        "steps": steps,
        "train_rows": len(train),
        "train_rows_written": len(ordered),
        "val_rows": len(val),
        "train_digest": digest(ordered),
        "val_digest": digest(val),
        "settings": values,
    }
    (out / "task.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "task.env").write_text(env_lines(values, seed, steps))
    return record


def check_tokenizer(model_dir: str, out: Path, seed: int) -> dict:
    """rlpost's prompt ids against `apply_chat_template(tokenize=True)` (TRL's `_tokenize_prompts`,
    verl's agent loop) for every exported row: the count of rows whose ids differ."""
    from transformers import AutoTokenizer

    from rlpost.data.dataset import prompt_ids

    tok = AutoTokenizer.from_pretrained(model_dir)
    differ, total = 0, 0
    for name in (f"train_s{seed}.jsonl", "val.jsonl"):
        for line in (out / name).read_text().splitlines():
            messages = json.loads(line)["prompt"]
            _, ours = prompt_ids(messages, tok, None, name)
            theirs = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            theirs = theirs["input_ids"] if hasattr(theirs, "keys") else theirs
            differ += list(theirs) != list(ours)
            total += 1
    return {"rows": total, "rows_whose_ids_differ": differ}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0, help="rlpost's run.seed: the order of the training batches")
    ap.add_argument("--steps", type=int, help="batches to write (default: one epoch, 7844 // 64 = 122)")
    ap.add_argument("--check-tokenizer", metavar="MODEL_DIR", help="compare prompt ids with this tokenizer's")
    ap.add_argument("overrides", nargs="*", help="more rlpost overrides (e.g. model.cache_dir=/tmp/rlcache)")
    args = ap.parse_args()
    record = export(args.out, args.seed, args.steps, args.overrides)
    if args.check_tokenizer:
        record["tokenizer_check"] = check_tokenizer(args.check_tokenizer, args.out, args.seed)
        (args.out / "task.json").write_text(json.dumps(record, indent=1) + "\n")
        if record["tokenizer_check"]["rows_whose_ids_differ"]:
            raise SystemExit(f"prompt ids differ from rlpost's: {record['tokenizer_check']}")
    print(json.dumps({k: v for k, v in record.items() if k != "settings"}))


if __name__ == "__main__":
    main()
