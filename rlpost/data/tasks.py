"""Offline tasks: problems generated locally and deterministically, no download needed.

`arithmetic`: two-operand integer addition written as ``"a+b="``. The ground truth is the sum
written with a fixed width of ``digits + 1`` characters, zero-padded (``"57+38="`` -> ``"095"``),
so that every answer has the same length and each answer character lines up with the same
columns of the operands: a small transformer learns that in a few hundred steps, while
variable-width answers take it thousands. Every operand pair with ``digits`` digits is enumerated
once, shuffled with a fixed seed, and split: the first ``num_val`` pairs are held out for
validation, the rest are training rows. The split depends only on ``(digits, seed, num_val)``, so
train and validation never overlap.

`carry_slip` is a sloppy teacher for the supervised warm-up of the tiny model: on a problem whose
units column carries, it forgets the carry (writes the sum minus 10) with a given probability. A
model warmed up on its answers knows the right answer but prefers the wrong one, which is the
headroom RL needs (docs/learnable-start.md).

`multiply`: two-operand multiplication written as ``"a*b="`` (``"347*281="`` -> ``"97507"``), a
problem a tiny model cannot do in its head: the multi-turn recipe (`+recipe=multiturn_tools`)
solves it by calling the calculator tool. Split like `arithmetic` (the same operand pairs).

`TASKS` is the registry of every offline task (`data.task`, `rlpost data`): each `Task` builds its
(train, validation) rows from the data config and names the cached copy by every setting that
changes them. The chat tasks for a real chat model (`sums_chat`, `sums_steps`) are in
`rlpost.data.chat_tasks`, reasoning-gym's procedural datasets in `rlpost.data.gym_tasks`; both
register here when this module is imported.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlpost.data.dataset import DataError
from rlpost.registry import Registry

ARITHMETIC = "arithmetic"
ARITHMETIC_FORMAT = 2  # bump when the rows change: cached copies are keyed by it
MULTIPLY = "multiply"
MULTIPLY_FORMAT = 1


MAX_PAIR_DIGITS = 3


def arithmetic_pairs(digits: int, seed: int) -> list[tuple[int, int]]:
    """All operand pairs with exactly `digits` digits (1 digit: 0..9), in a seeded order."""
    if digits < 1:
        raise ValueError(f"arithmetic task: digits must be >= 1, got {digits}")
    if digits > MAX_PAIR_DIGITS:  # every pair is listed: 4 digits would be 81 million rows
        raise DataError(
            f"data.arithmetic_digits={digits}: the arithmetic, multiply and sums_chat tasks list every pair of "
            f"{digits}-digit numbers as a problem ({(9 * 10 ** (digits - 1)) ** 2:.2g} of them); give at most "
            f"{MAX_PAIR_DIGITS} digits ({(9 * 10 ** (MAX_PAIR_DIGITS - 1)) ** 2} problems), or data.task=sums_steps, "
            "which samples its problems"
        )
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    hi = 10**digits
    pairs = [(a, b) for a in range(lo, hi) for b in range(lo, hi)]
    random.Random(seed).shuffle(pairs)
    return pairs


def arithmetic_answer(value: int, digits: int) -> str:
    """`value` written with `digits + 1` characters, zero-padded: the task's answer format."""
    return str(value).zfill(digits + 1)


def arithmetic_row(a: int, b: int, digits: int) -> dict:
    return {"prompt": f"{a}+{b}=", "ground_truth": arithmetic_answer(a + b, digits), "data_source": ARITHMETIC}


def val_size_error(task: str, digits: int, num_val: int, problems: int) -> DataError:
    return DataError(
        f"data.val_size={num_val}: data.task={task} with data.arithmetic_digits={digits} has {problems} problems; "
        f"hold out 1 to {problems - 1} of them"
    )


def arithmetic_split(digits: int, seed: int, num_val: int) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows) for the addition task."""
    pairs = arithmetic_pairs(digits, seed)
    if not 0 < num_val < len(pairs):
        raise val_size_error("arithmetic", digits, num_val, len(pairs))
    val = [arithmetic_row(a, b, digits) for a, b in pairs[:num_val]]
    train = [arithmetic_row(a, b, digits) for a, b in pairs[num_val:]]
    return train, val


def multiply_split(digits: int, seed: int, num_val: int) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows) for the multiplication task; the answer is the plain product
    (reward `arithmetic`: exact match)."""
    pairs = arithmetic_pairs(digits, seed)
    if not 0 < num_val < len(pairs):
        raise val_size_error("multiply", digits, num_val, len(pairs))
    rows = [{"prompt": f"{a}*{b}=", "ground_truth": str(a * b), "data_source": ARITHMETIC} for a, b in pairs]
    return rows[num_val:], rows[:num_val]


def task_split(task: str, digits: int, num_val: int) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows) of a task of the tiny model (arithmetic, multiply) by name."""
    split = {ARITHMETIC: arithmetic_split, MULTIPLY: multiply_split}[task]
    return split(digits, seed=0, num_val=num_val)


def task_format(task: str) -> int:
    return TASKS.get(task).format


# ------------------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class Task:
    """An offline task. `rows(data)` and `cache_name(data)` read the `data` config section
    (`rlpost.config.DataConfig`); `cache_name` must change with every setting that changes the rows,
    `format` among them (bump it when the code that writes the rows changes)."""

    name: str
    help: str  # one line, for `data.task`'s documentation
    format: int
    rows: Callable[..., tuple[list[dict], list[dict]]]
    cache_name: Callable[..., str]
    tiny: bool = False  # the tiny model (`model.path=tiny`) can be warmed up on it
    reads: tuple[str, ...] = ("arithmetic_digits", "val_size")  # the `data` keys its rows depend on


TASKS: Registry[Task] = Registry("offline task", key="data.task")


def register_task(task: Task) -> Task:
    """`TASKS.register` under the task's own name."""
    return TASKS.register(task.name, task)


def task_rows(data) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows) of the offline task `data.task`, from the `data` config section."""
    return TASKS.get(data.task).rows(data)


def task_cache_name(data) -> str:
    """The folder name of `data.task`'s cached rows (under `model.cache_dir`/data)."""
    return TASKS.get(data.task).cache_name(data)


def digits_key(data, name: str, fmt: int) -> str:
    """`NAME-dDIGITS-vVAL-fFORMAT`: the cache name of a task whose rows depend on these alone."""
    return f"{name}-d{data.arithmetic_digits}-v{data.val_size}-f{fmt}"


register_task(
    Task(
        ARITHMETIC,
        "a+b=, the answer zero-padded; for the tiny model",
        ARITHMETIC_FORMAT,
        lambda data: task_split(ARITHMETIC, data.arithmetic_digits, data.val_size),
        lambda data: digits_key(data, ARITHMETIC, ARITHMETIC_FORMAT),
        tiny=True,
    )
)
register_task(
    Task(
        MULTIPLY,
        "a*b=, for the calculator tool; for the tiny model",
        MULTIPLY_FORMAT,
        lambda data: task_split(MULTIPLY, data.arithmetic_digits, data.val_size),
        lambda data: digits_key(data, MULTIPLY, MULTIPLY_FORMAT),
        tiny=True,
    )
)


def operands(row: dict) -> tuple[int, int]:
    a, b = re.split(r"[+*]", row["prompt"].rstrip("="))
    return int(a), int(b)


def units_carry(row: dict) -> bool:
    """Whether the units column of the row's addition carries into the tens."""
    a, b = operands(row)
    return a % 10 + b % 10 >= 10


def carry_slip(row: dict, rng: random.Random, prob: float) -> dict:
    """The row as a sloppy teacher writes it: where the units column carries, with probability
    `prob` the answer forgets that carry (the sum minus 10), else it is right."""
    if prob > 0 and units_carry(row) and rng.random() < prob:
        a, b = operands(row)
        width = len(row["ground_truth"])
        return {**row, "ground_truth": str(a + b - 10).zfill(width)}
    return row


def write_jsonl(rows: list[dict], path: Path) -> Path:
    """Write rows atomically (`write_atomic`)."""
    return write_atomic("".join(json.dumps(row) + "\n" for row in rows), path)


def write_atomic(text: str, path: Path) -> Path:
    """`text` into a temporary file of this process's own, then renamed to `path` (two runs that
    built one task's cache at once wrote, then renamed, the same one: the ninth catalogue's n76)."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False) as f:
        try:
            f.write(text)
            f.flush()
        except BaseException:  # a full disk (the 11th catalogue's t78), a SIGTERM (the 18th's t83): the part goes
            Path(f.name).unlink(missing_ok=True)
            raise
    os.chmod(f.name, 0o644)  # (a temporary file is the owner's alone)
    Path(f.name).replace(path)
    return path


def cached_task(folder: Path, rows) -> None:
    """An offline task's rows in `folder` (train.jsonl, val.jsonl), written by `rows()` -> (train,
    val) unless `sizes.json`, written last, holds both files' sizes: a file cut short or edited
    (the ninth catalogue's n74, n75: trained on part of the rows without a word) is written again."""
    names, manifest = ("train.jsonl", "val.jsonl"), folder / "sizes.json"
    try:
        if json.loads(manifest.read_text()) == {n: (folder / n).stat().st_size for n in names}:
            return
    except (OSError, ValueError):
        pass
    try:
        for split, name in zip(rows(), names):
            write_jsonl(split, folder / name)
        write_atomic(json.dumps({n: (folder / n).stat().st_size for n in names}), manifest)
    except OSError as e:  # a full disk, a read-only cache (the fifteenth catalogue's t57: a raw traceback)
        raise DataError(
            f"model.cache_dir: writing the task's rows into {folder} failed ({e.strerror or e}); free space there or "
            "set model.cache_dir"
        ) from None


from rlpost.data import chat_tasks, gym_tasks  # noqa: E402, F401  (they register their tasks)
