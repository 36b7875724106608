"""`data.task=reasoning_gym`: rows from reasoning-gym's procedural datasets (the `tasks` extra)."""

import json
import sys
from dataclasses import replace

import pytest

from rlpost.config import DataConfig
from rlpost.config.schema import GymConfig
from rlpost.data import gym_tasks
from rlpost.data.dataset import DataError, render_prompt
from rlpost.data.tasks import task_cache_name, task_rows
from rlpost.tiny.model import build_char_tokenizer

rg = pytest.importorskip("reasoning_gym")


def data(train_size=40, val_size=10, **gym) -> DataConfig:
    return replace(DataConfig(), task="reasoning_gym", train_size=train_size, val_size=val_size, gym=GymConfig(**gym))


def test_rows_are_chat_messages_with_the_scorers_json():
    train, val = task_rows(data())
    assert (len(train), len(val)) == (40, 10)
    system, user = val[0]["prompt"]
    assert system == {"role": "system", "content": rg.utils.SYSTEM_PROMPTS["default"]}
    assert "<answer>" in system["content"] and user["role"] == "user"
    entry = rg.create_dataset("basic_arithmetic", size=10, seed=40)[0]  # validation: seed + train_size
    assert user["content"] == entry["question"] and val[0]["data_source"] == "reasoning_gym"
    truth = json.loads(val[0]["ground_truth"])
    assert truth == {
        "dataset": "basic_arithmetic",
        "answer": entry["answer"],
        "metadata": json.loads(json.dumps(entry["metadata"])),
    }
    assert rg.get_score_answer_fn("basic_arithmetic")(truth["answer"], truth) == 1.0


def test_the_prompt_goes_through_the_chat_template():
    _, val = task_rows(data())
    rendered = render_prompt(val[0]["prompt"], build_char_tokenizer())
    assert val[0]["prompt"][1]["content"] in rendered and rendered.startswith("system: Given a problem")


def test_system_prompt_by_name_by_text_or_none():
    assert task_rows(data(system_prompt="direct"))[1][0]["prompt"][0]["content"] == rg.utils.SYSTEM_PROMPTS["direct"]
    assert task_rows(data(system_prompt="Answer in <answer> tags."))[1][0]["prompt"][0]["content"] == (
        "Answer in <answer> tags."
    )
    assert [m["role"] for m in task_rows(data(system_prompt=""))[1][0]["prompt"]] == ["user"]


def test_config_overrides_reach_the_dataset():
    train, _ = task_rows(data(config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}))
    for row in train:
        assert json.loads(row["ground_truth"])["metadata"]["num_terms"] == 2


def test_splits_do_not_overlap_even_in_a_small_space():
    # one-digit sums of two terms: about 400 distinct questions, so seeds alone would repeat some
    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    train, val = task_rows(data(train_size=300, val_size=100, config=small))
    questions = lambda rows: {r["prompt"][-1]["content"] for r in rows}  # noqa: E731
    assert not questions(train) & questions(val)
    assert len(val) == 100 and 0 < len(train) < 300  # the repeats left the training split
    raw = {e["question"] for e in rg.create_dataset("basic_arithmetic", size=300, seed=0, **small)}
    assert raw & questions(val)  # (without the filter they would overlap)


def test_rows_are_deterministic_and_the_seed_changes_them():
    assert task_rows(data()) == task_rows(data())
    assert task_rows(data(seed=1))[0] != task_rows(data())[0]


def test_cache_names_change_with_every_setting_that_changes_the_rows(monkeypatch):
    base = data()
    changed = [
        data(name="chain_sum"),
        data(config={"max_terms": 3}),
        data(seed=1),
        data(train_size=41),
        data(val_size=11),
        data(system_prompt="direct"),
    ]
    names = {task_cache_name(d) for d in [base, *changed]}
    assert len(names) == len(changed) + 1 and task_cache_name(base).startswith("reasoning_gym-basic_arithmetic-")
    assert task_cache_name(data()) == task_cache_name(base)
    assert task_cache_name(replace(base, operands=5, arithmetic_digits=4)) == task_cache_name(base)
    monkeypatch.setattr(gym_tasks, "GYM_FORMAT", gym_tasks.GYM_FORMAT + 1)
    assert task_cache_name(base) not in names
    monkeypatch.setattr(gym_tasks.importlib.metadata, "version", lambda name: "9.9.9")
    assert task_cache_name(base) not in names  # another reasoning-gym may make other rows


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(name="no_such_dataset"), "data.gym.name='no_such_dataset' is not a reasoning-gym dataset"),
        (dict(config={"seed": 3}), r"data.gym.config sets \['seed'\]"),
        (dict(config={"no_such_field": 1}), "data.gym.config="),
        (dict(config={"min_terms": 5, "max_terms": 2}), "data.gym.config="),
    ],
)
def test_bad_settings_name_the_key(settings, message):
    with pytest.raises(DataError, match=message):
        task_rows(data(**settings))


def test_a_dataset_whose_items_do_not_survive_json_is_refused(monkeypatch):
    scorer = rg.get_score_answer_fn("basic_arithmetic")
    # a scorer that reads a tuple from the metadata, which JSON turns into a list
    picky = lambda answer, entry: float(isinstance(entry["metadata"]["difficulty"]["num_terms"], tuple))  # noqa: E731
    monkeypatch.setattr(rg, "get_score_answer_fn", lambda name: picky)
    with pytest.raises(DataError, match="do not survive JSON"):
        task_rows(data())
    monkeypatch.setattr(rg, "get_score_answer_fn", lambda name: scorer)
    task_rows(data())


def test_a_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym: ImportError
    with pytest.raises(DataError, match=r"reasoning-gym package: pip install 'reasoning-gym>=0\.1\.25'") as info:
        task_rows(data())
    assert isinstance(info.value, ImportError)
