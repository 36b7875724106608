"""The tiny model's warm-up: a short supervised pass on an offline task so that sampling already
finds correct answers, which GRPO needs to learn from: a policy that is never rewarded has nothing
to reinforce. Its examples are token segments, trained or not: `answer_example` (prompt, then
answer) or `calculator_trace` (a whole calculator episode: the tool call, the tool's result
rendered by the chat template, the answer). `sample_answers` draws completions for the start
model's pass@k (docs/learnable-start.md).
"""

from __future__ import annotations

import json
import random
import time
from typing import Callable

import torch

from rlpost.algos.schedule import cosine

Segment = tuple[list[int], bool]  # token ids, and whether the warm-up trains on them


def sft_batch(examples: list[list[Segment]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] of the examples' segments end to end, the attention mask, and the
    labels: the ids of trained segments, -100 elsewhere."""
    seqs = [[t for ids, _ in ex for t in ids] for ex in examples]
    labels = [[t if trained else -100 for ids, trained in ex for t in ids] for ex in examples]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(examples), width), pad_id)
    lab = torch.full((len(examples), width), -100)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (seq, label) in enumerate(zip(seqs, labels)):
        ids[i, : len(seq)] = torch.tensor(seq)
        lab[i, : len(label)] = torch.tensor(label)
        mask[i, : len(seq)] = 1
    return ids, mask, lab


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def answer_example(tokenizer, row: dict) -> list[Segment]:
    """`prompt`, then `ground_truth + eos` (trained)."""
    return [
        (encode(tokenizer, row["prompt"]), False),
        (encode(tokenizer, row["ground_truth"]) + [tokenizer.eos_token_id], True),
    ]


def calculator_call(expression: str) -> str:
    """A call of the `calculator` tool in the `hermes` format (compact JSON)."""
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"


def calculator_trace(tokenizer, row: dict, rng: random.Random, tool_share: float) -> list[Segment]:
    """A teacher's episode of the multiply task (`a*b=`). With probability `tool_share` it calls
    the calculator (trained), reads the result (the chat template's `tool` turn, not trained) and
    answers with it; otherwise it answers in its head, wrongly (the product off by 1 to 999). A
    model warmed up on these knows how to use the tool but often does not: headroom for RL."""
    from rlpost.data.tasks import operands
    from rlpost.rollout.episodes import render_suffix

    a, b = operands(row)
    eos = tokenizer.eos_token_id
    prompt = (encode(tokenizer, row["prompt"]), False)
    if rng.random() < tool_share:
        product = str(a * b)
        return [
            prompt,
            (encode(tokenizer, calculator_call(f"{a}*{b}")) + [eos], True),
            (render_suffix(tokenizer, [{"role": "tool", "content": product}]), False),
            (encode(tokenizer, product) + [eos], True),
        ]
    off = rng.randint(1, 999)
    guess = a * b - off if a * b >= off and rng.random() < 0.5 else a * b + off
    return [prompt, (encode(tokenizer, str(guess)) + [eos], True)]


def by_length(examples: list[list[Segment]]) -> list[list[list[Segment]]]:
    """The examples in one group, or two where the shorter ones are at most half as long as the
    longest (a short answer is not padded to the length of a whole tool episode)."""
    size = [sum(len(ids) for ids, _ in ex) for ex in examples]
    short = [ex for ex, n in zip(examples, size) if n <= max(size) // 2]
    long = [ex for ex, n in zip(examples, size) if n > max(size) // 2]
    return [g for g in (short, long) if g]


def warm_up(
    model,
    tokenizer,
    rows: list[dict],
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    example: Callable[[dict, random.Random], list[Segment]],
    log=print,
) -> None:
    """Supervised warm-up: next-token loss on the trained segments of `example(row, rng)` for
    random rows, AdamW, a linear learning-rate ramp over the first 5% of the steps, then cosine decay to 0.
    The whole schedule runs, so the model ends where the schedule settles it, not part-way
    through learning the task. Runs on the device the model is on (bf16 autocast on CUDA)."""
    rng = random.Random(seed)
    device = next(model.parameters()).device
    ramp = max(steps // 20, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / ramp) * cosine(s, steps, 0.0))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    model.train()
    start = time.time()
    for step in range(steps):
        examples = [example(r, rng) for r in rng.sample(rows, batch_size)]
        opt.zero_grad(set_to_none=True)
        groups = by_length(examples)
        trained = [sum(len(ids) for ex in g for ids, on in ex if on) for g in groups]
        batch_loss = 0.0
        for group, count in zip(groups, trained):
            ids, mask, labels = (t.to(device) for t in sft_batch(group, tokenizer.pad_token_id))
            with autocast:
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            # the mean over all the batch's trained tokens (one group: as it is)
            (loss if len(groups) == 1 else loss * (count / sum(trained))).backward()
            batch_loss += loss.item() * count / sum(trained)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % max(steps // 5, 1) == 0:
            log(f"warm-up step {step + 1}/{steps}  loss {batch_loss:.3f}  {time.time() - start:.0f}s")
    model.eval()


@torch.no_grad()
def sample_answers(
    model, tokenizer, prompts: list[str], n: int, max_tokens: int, greedy: bool, seed: int = 0, batch_size: int = 2048
) -> list[list[str]]:
    """`n` completions of each prompt (greedy: one), decoded; sampling at temperature 1."""
    from rlpost.data.padding import left_pad

    torch.manual_seed(seed)
    device = next(model.parameters()).device
    rows = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts for _ in range(n)]
    texts: list[str] = []
    for i in range(0, len(rows), batch_size):
        ids, mask = left_pad(rows[i : i + batch_size], tokenizer.pad_token_id)
        sampling = (
            {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
            if greedy
            else {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
        )
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.long().to(device),
            max_new_tokens=max_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **sampling,
        )
        texts += tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    return [texts[j * n : (j + 1) * n] for j in range(len(prompts))]
