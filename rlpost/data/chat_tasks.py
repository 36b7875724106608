"""Offline chat tasks for a real chat model (SmolLM2-135M-Instruct and alike): the prompt is chat
messages, which go through the model's chat template.

`sums_chat`: "What is a+b? Reply with the number only." on the pairs of the `arithmetic` task, split
the same way (the same `data.arithmetic_digits`, seed and held-out pairs); the ground truth is the
plain sum ("68"), scored by the last number of the response (reward `last_number`).

`sums_steps`: `data.operands` numbers of `data.arithmetic_digits` digits each, to be added step by
step, ending with a line "Answer: N" (reward `answer_line`). Problems are sampled with a fixed
seed, each a distinct multiset of numbers (another order of the same numbers is the same problem,
so it is never in both splits): the first `data.val_size` are held out, the next `data.train_size`
train. A space with fewer problems than asked for is enumerated whole, and its training split is
what the held-out problems leave.

The wording lives in `SUMS_CHAT_PROMPT` and `SUMS_STEPS_PROMPT`: change it there, and bump the
task's format (a test pins the rows of each format, so a change without a bump fails it).
"""

from __future__ import annotations

import itertools
import math
import random

from rlpost.data.dataset import DataError
from rlpost.data.tasks import Task, arithmetic_pairs, digits_key, register_task

SUMS_CHAT = "sums_chat"
SUMS_CHAT_FORMAT = 1  # bump when the rows change: cached copies are keyed by it
SUMS_CHAT_PROMPT = "What is {a}+{b}? Reply with the number only."

SUMS_STEPS = "sums_steps"
SUMS_STEPS_FORMAT = 1
SUMS_STEPS_PROMPT = (
    "What is {expression}? Work it out step by step, adding one number at a time, "
    "and end with a final line of the form 'Answer: N', where N is the total."
)
SUMS_STEPS_SEED = 0


def user_message(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def sums_chat_split(digits: int, num_val: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows): the `arithmetic` task's pairs and split, as a chat question."""
    pairs = arithmetic_pairs(digits, seed)
    if not 0 < num_val < len(pairs):
        raise DataError(f"sums_chat task: data.val_size must be in 1..{len(pairs) - 1}, got {num_val}")
    rows = [
        {
            "prompt": user_message(SUMS_CHAT_PROMPT.format(a=a, b=b)),
            "ground_truth": str(a + b),
            "data_source": "last_number",
        }
        for a, b in pairs
    ]
    return rows[num_val:], rows[:num_val]


def operand_range(digits: int) -> range:
    """The numbers with exactly `digits` digits (1 digit: 0..9), as in `arithmetic_pairs`."""
    return range(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


def sample_problems(digits: int, operands: int, count: int, seed: int, most: int = 0) -> list[tuple[int, ...]]:
    """`count` distinct multisets of `operands` (to `most`, each count as likely) numbers of `digits`
    digits (fewer when the space holds fewer), each in a random order, in a seeded order."""
    numbers, counts = operand_range(digits), range(operands, max(operands, most) + 1)
    rng = random.Random(seed)
    if sum(math.comb(len(numbers) + k - 1, k) for k in counts) <= 4 * count:  # small: enumerated, shuffled
        problems = [p for k in counts for p in itertools.combinations_with_replacement(numbers, k)]
        rng.shuffle(problems)
        return [tuple(rng.sample(p, len(p))) for p in problems[:count]]
    problems, seen = [], set()
    while len(problems) < count:  # a space over 4x `count`: under a quarter of the draws repeat
        k = operands if len(counts) == 1 else rng.choice(counts)  # (one count: the draws of format 1)
        drawn = tuple(rng.choice(numbers) for _ in range(k))
        key = tuple(sorted(drawn))
        if key not in seen:
            seen.add(key)
            problems.append(drawn)
    return problems


def sums_steps_row(numbers: tuple[int, ...]) -> dict:
    expression = " + ".join(map(str, numbers))
    return {
        "prompt": user_message(SUMS_STEPS_PROMPT.format(expression=expression)),
        "ground_truth": str(sum(numbers)),
        "data_source": "answer_line",
    }


def sums_steps_split(
    digits: int, operands: int, num_train: int, num_val: int, seed: int = SUMS_STEPS_SEED, most: int = 0
) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows) of the step-by-step addition task (`most`: `data.max_operands`)."""
    if operands < 2:
        raise DataError(f"sums_steps task: data.operands must be >= 2, got {operands}")
    if most and most < operands:
        raise DataError(f"sums_steps task: data.max_operands={most} is below data.operands={operands}; raise it or 0")
    problems = sample_problems(digits, operands, num_val + num_train, seed, most)
    if not 0 < num_val < len(problems):
        raise DataError(
            f"sums_steps task: {operands} numbers of {digits} digits make {len(problems)} problems; "
            f"data.val_size={num_val} must be in 1..{len(problems) - 1} (raise data.arithmetic_digits or data.operands)"
        )
    rows = [sums_steps_row(p) for p in problems]
    return rows[num_val:], rows[:num_val]


register_task(
    Task(
        SUMS_CHAT,
        "'What is a+b?' as chat messages, answered by the last number; for a chat model",
        SUMS_CHAT_FORMAT,
        lambda data: sums_chat_split(data.arithmetic_digits, data.val_size),
        lambda data: digits_key(data, SUMS_CHAT, SUMS_CHAT_FORMAT),
    )
)
register_task(
    Task(
        SUMS_STEPS,
        "`data.operands` numbers added step by step, ending 'Answer: N'; for a chat model",
        SUMS_STEPS_FORMAT,
        lambda data: sums_steps_split(
            data.arithmetic_digits, data.operands, data.train_size, data.val_size, most=data.max_operands
        ),
        lambda data: (
            f"{SUMS_STEPS}-d{data.arithmetic_digits}-k{data.operands}"
            f"{f'-{data.max_operands}' if data.max_operands > data.operands else ''}-n{data.train_size}"
            f"-v{data.val_size}-f{SUMS_STEPS_FORMAT}"
        ),
        reads=("arithmetic_digits", "operands", "max_operands", "train_size", "val_size"),
    )
)
