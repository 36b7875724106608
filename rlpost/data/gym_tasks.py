"""reasoning-gym's procedural datasets as an offline task (`data.task=reasoning_gym`; the
`reasoning-gym` package, `pip install -e '.[tasks]'`).

`data.gym.name` picks the dataset, `data.gym.config` overrides its config (passed to
`reasoning_gym.create_dataset`). Training rows are items 0..`data.train_size`-1 of the dataset
seeded `data.gym.seed`; validation rows are `data.val_size` items seeded `seed + train_size`.
reasoning-gym seeds item i of a dataset with `seed + i`, so the two splits never share a
generator; a training question that equals a validation question all the same (a small space) is
dropped from training.

A row's prompt is chat messages: a system message asking for the final answer inside
`<answer></answer>` (`data.gym.system_prompt`: a name in `reasoning_gym.utils.SYSTEM_PROMPTS`, or
the text itself) and the question. Its ground truth is JSON: the dataset that scores it (the item's
`source_dataset`, so composite datasets are scored by their parts), the answer and the metadata,
which is what the dataset's `score_answer(answer, entry)` reads (reward `reasoning_gym`). The
first rows are checked to score their own answer the same through that JSON as on the item, so a
dataset whose metadata does not survive JSON stops here, not as a silent 0 in training.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json

from rlpost.data.dataset import DataError
from rlpost.data.tasks import Task, register_task

REASONING_GYM = "reasoning_gym"
GYM_FORMAT = 1  # bump when the rows change: cached copies are keyed by it
PIP_HINT = "pip install 'reasoning-gym>=0.1.25' (or pip install -e '.[tasks]')"
CHECKED_ROWS = 8  # rows whose reference answer is scored through their JSON at generation


class MissingPackage(ImportError, DataError):
    """An optional package a task needs is not installed (a DataError: `rlpost train` prints it
    without a traceback)."""


def import_reasoning_gym():
    """The `reasoning_gym` module, or `MissingPackage` saying what to install."""
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError as e:
        raise MissingPackage(f"data.task=reasoning_gym needs the reasoning-gym package: {PIP_HINT}") from e


def system_prompt(name_or_text: str) -> str:
    """`data.gym.system_prompt` as text: a name in reasoning-gym's `SYSTEM_PROMPTS`, or the text."""
    prompts = importlib.import_module("reasoning_gym.utils").SYSTEM_PROMPTS
    return prompts.get(name_or_text, name_or_text)


def gym_entry_json(name: str, entry: dict) -> str:
    """What the scorer needs of one item, as the row's ground truth."""
    dataset = entry.get("metadata", {}).get("source_dataset") or name
    return json.dumps({"dataset": dataset, "answer": entry["answer"], "metadata": entry["metadata"]}, default=str)


def gym_row(name: str, entry: dict, system: str) -> dict:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": entry["question"]})
    return {"prompt": messages, "ground_truth": gym_entry_json(name, entry), "data_source": REASONING_GYM}


def check_json_entries(rg, name: str, entries: list[dict]) -> None:
    """The reference answer scores the same on the stored JSON as on the item itself."""
    for entry in entries[:CHECKED_ROWS]:
        stored = json.loads(gym_entry_json(name, entry))
        score = rg.get_score_answer_fn(stored["dataset"])
        on_item, on_json = score(entry["answer"], entry), score(stored["answer"], stored)
        if on_item != on_json:
            raise DataError(
                f"data.gym.name={name!r}: its items do not survive JSON (the reference answer scores "
                f"{on_item} on the item and {on_json} on the row's ground truth); this dataset is not supported"
            )


def create_items(rg, name: str, config: dict, size: int, seed: int) -> list[dict]:
    try:
        dataset = rg.create_dataset(name, size=size, seed=seed, **config)
    except (TypeError, ValueError, AssertionError) as e:  # an unknown or bad config field
        raise DataError(f"data.gym.config={config} for data.gym.name={name!r}: {e}") from e
    return list(dataset)


def gym_split(data) -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows) of `data.gym.name`."""
    rg, g = import_reasoning_gym(), data.gym
    config = dict(g.config)
    clash = sorted({"size", "seed"} & set(config))
    if clash:
        raise DataError(f"data.gym.config sets {clash}: use data.train_size, data.val_size and data.gym.seed")
    if g.name not in rg.factory.DATASETS:
        names = sorted(rg.factory.DATASETS)
        raise DataError(f"data.gym.name={g.name!r} is not a reasoning-gym dataset; choose one of {names}")
    train = create_items(rg, g.name, config, data.train_size, g.seed)
    val = create_items(rg, g.name, config, data.val_size, g.seed + data.train_size)
    held_out = {e["question"] for e in val}
    train = [e for e in train if e["question"] not in held_out]
    if not train:
        raise DataError(f"data.gym.name={g.name!r}: every training question is also a validation question")
    check_json_entries(rg, g.name, train)
    system = system_prompt(g.system_prompt) if g.system_prompt else ""
    return [gym_row(g.name, e, system) for e in train], [gym_row(g.name, e, system) for e in val]


def gym_cache_name(data) -> str:
    """`reasoning_gym-NAME-DIGEST`: the digest of every setting that changes the rows, the
    installed reasoning-gym's version and the resolved system prompt among them."""
    g = data.gym
    import_reasoning_gym()
    spec = {
        "name": g.name,
        "config": dict(g.config),
        "seed": g.seed,
        "train_size": data.train_size,
        "val_size": data.val_size,
        "system_prompt": system_prompt(g.system_prompt) if g.system_prompt else "",
        "format": GYM_FORMAT,
        "reasoning_gym": importlib.metadata.version("reasoning-gym"),
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{REASONING_GYM}-{g.name}-{digest}"


register_task(
    Task(
        REASONING_GYM,
        "a reasoning-gym dataset (`data.gym`), scored by its own scorer; for a chat model",
        GYM_FORMAT,
        gym_split,
        gym_cache_name,
        reads=("gym", "train_size", "val_size"),
    )
)
