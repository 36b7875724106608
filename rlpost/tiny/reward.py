"""A tiny reward model built locally: `reward.model.path=tiny`.

A sequence classifier (one logit) that reads `prompt + answer` of the offline addition task and
says whether the answer is right. It starts from the tiny policy's weights (`model.path=tiny`: the
body already adds) with a new score head, and trains with binary cross-entropy on answers of two
kinds, labelled by the task's rule: the start policy's own samples (the answers it will be asked to
judge) and edited ones (a dropped carry, a changed digit, a missing or extra digit). Its held-out
accuracy (problems it never saw) is written next to it (`RM_EVAL`). Cached like the tiny policy:
built under a temporary name, renamed when complete.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

import torch

RM_EVAL = "rm_eval.json"
BUILD = {"steps": 3000, "batch_size": 64, "lr": 1e-3, "samples": 4, "problems": 3000, "seed": 0, "format": 2}


def tiny_reward_model_dir(policy_dir: str, build: dict = BUILD) -> Path:
    digest = hashlib.sha256(json.dumps({"policy": Path(policy_dir).name, **build}).encode()).hexdigest()[:12]
    return Path(policy_dir).parent / f"tiny-rm-{digest}"


def edited_answer(row: dict, rng: random.Random) -> str:
    """A wrong answer to `row` of the kind a learner (or a policy gaming the reward model) writes:
    a dropped carry, off by 1, 10 or 100, one digit changed, any other number, a digit missing or
    one too many."""
    from rlpost.data.tasks import operands

    answer = row["ground_truth"]
    a, b = operands(row)
    kind = rng.randrange(6)
    if kind == 0 and a + b >= 10:
        wrong = str(a + b - 10).zfill(len(answer))
    elif kind == 1:
        wrong = str(max(a + b + rng.choice([-100, -10, -1, 1, 10, 100]), 0)).zfill(len(answer))
    elif kind == 2:
        i = rng.randrange(len(answer))
        wrong = answer[:i] + str((int(answer[i]) + rng.randrange(1, 10)) % 10) + answer[i + 1 :]
    elif kind == 3:
        wrong = str(rng.randrange(10 ** len(answer))).zfill(len(answer))
    elif kind == 4 and len(answer) > 1:
        i = rng.randrange(len(answer))
        wrong = answer[:i] + answer[i + 1 :]
    else:
        wrong = answer + str(rng.randrange(10))
    return wrong if wrong != answer else answer + "0"


def labelled_answers(policy, tokenizer, rows: list[dict], samples: int, max_tokens: int, seed: int) -> list:
    """(prompt, answer, right?) triples: `samples` of the policy's own answers to each row and as
    many edited wrong ones, each labelled by the task's rule."""
    from rlpost.rewards.base import RewardInput
    from rlpost.rewards.builtin import arithmetic
    from rlpost.tiny.warmup import sample_answers

    rng = random.Random(seed)
    drawn = sample_answers(policy, tokenizer, [r["prompt"] for r in rows], samples, max_tokens, greedy=False, seed=seed)
    out = []
    for row, answers in zip(rows, drawn):
        for text in answers + [edited_answer(row, rng) for _ in range(samples)] + [row["ground_truth"]]:
            right = arithmetic(RewardInput(row["prompt"], text, row["ground_truth"], row["data_source"])) >= 1.0
            out.append((row["prompt"], text, right))
    return out


def train_classifier(model, tokenizer, examples: list, steps: int, batch_size: int, lr: float, seed: int) -> None:
    """Binary cross-entropy on the score logit of `prompt + answer`, right and wrong answers drawn
    in equal numbers; AdamW with a cosine schedule."""
    from rlpost.algos.schedule import cosine

    rng = random.Random(seed)
    right = [e for e in examples if e[2]]
    wrong = [e for e in examples if not e[2]]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine(s, steps, 0.0))
    model.train()
    for _ in range(steps):
        batch = rng.sample(right, batch_size // 2) + rng.sample(wrong, batch_size // 2)
        texts = [p + a for p, a, _ in batch]
        enc = tokenizer(texts, add_special_tokens=False, padding=True, padding_side="right", return_tensors="pt")
        enc = enc.to(next(model.parameters()).device)
        labels = torch.tensor([float(r) for _, _, r in batch], device=enc.input_ids.device)
        logits = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()


def classifier_accuracy(model, tokenizer, examples: list) -> dict[str, float]:
    """Accuracy (logit > 0 means right) on right and on wrong answers, and their mean."""
    from rlpost.rewards.model import classifier_scores

    scores = classifier_scores(model, tokenizer, [p + a for p, a, _ in examples], 512, 64, sigmoid=False)
    hits = {True: [], False: []}
    for (_, _, right), s in zip(examples, scores):
        hits[right].append((s > 0) == right)
    on_right, on_wrong = sum(hits[True]) / len(hits[True]), sum(hits[False]) / len(hits[False])
    return {"accuracy_right": on_right, "accuracy_wrong": on_wrong, "balanced_accuracy": (on_right + on_wrong) / 2}


def ensure_tiny_reward_model(
    policy_dir: str, digits: int, val_size: int, device: str = "cpu", log=print, build: dict = BUILD
) -> Path:
    """Build (once) and return the tiny reward model made from the tiny policy at `policy_dir`
    (`build`: steps, batch, lr, sampled answers, problems, seed). On `cuda` the build runs in a
    child process, so that this one holds no CUDA context."""
    final = tiny_reward_model_dir(policy_dir, build)
    if not (final / "config.json").is_file():
        log(f"building the tiny reward model into {final} on {device} (first run only)")
        if device == "cuda":
            import multiprocessing

            child = multiprocessing.get_context("spawn").Process(
                target=build_tiny_reward_model, args=(policy_dir, digits, val_size, final, print, device, build)
            )
            child.start()
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"building the tiny reward model on {device} failed (exit code {child.exitcode})")
        else:
            build_tiny_reward_model(policy_dir, digits, val_size, final, log, "cpu", build)
    report = json.loads((final / RM_EVAL).read_text())
    log(f"tiny reward model: held-out balanced accuracy {report['held_out']['balanced_accuracy']:.3f}")
    return final


def build_tiny_reward_model(
    policy_dir: str, digits: int, val_size: int, final: Path, log=print, device: str = "cpu", build: dict = BUILD
) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from rlpost.data.tasks import arithmetic_split
    from rlpost.models.loading import load_tokenizer
    from rlpost.tiny.build import save_built

    b, start = build, time.time()
    torch.manual_seed(b["seed"])
    tokenizer = load_tokenizer(policy_dir)
    train_rows, val_rows = arithmetic_split(digits, seed=0, num_val=val_size)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).to(device).eval()
    problems = random.Random(b["seed"]).sample(train_rows, min(b["problems"], len(train_rows)))
    train = labelled_answers(policy, tokenizer, problems, b["samples"], digits + 2, b["seed"])
    held_out = labelled_answers(policy, tokenizer, val_rows, b["samples"], digits + 2, b["seed"] + 1)
    del policy
    model = AutoModelForSequenceClassification.from_pretrained(policy_dir, num_labels=1, dtype=torch.float32).to(device)
    model.config.pad_token_id = tokenizer.pad_token_id
    train_classifier(model, tokenizer, train, b["steps"], b["batch_size"], b["lr"], b["seed"])
    report = {
        "build": b,
        "policy": str(policy_dir),
        "train_examples": len(train),
        "held_out": {"examples": len(held_out), **classifier_accuracy(model, tokenizer, held_out)},
        "train": classifier_accuracy(model, tokenizer, train[:4000]),
        "build_s": round(time.time() - start, 1),
        "device": device,
    }
    save_built(final, model, tokenizer, RM_EVAL, report)
    log(f"tiny reward model ready ({time.time() - start:.0f}s)")
