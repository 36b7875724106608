"""The offline task registry and the chat tasks (`sums_chat`, `sums_steps`): rows, splits, cache
names, the config's and the CLI's choices, and prompts through a chat template."""

import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rlpost.config import DataConfig, compose, iter_fields
from rlpost.config.rules import tiny_model_task
from rlpost.controller.setup import check_reward_routing, data_sources
from rlpost.data import chat_tasks
from rlpost.data.dataset import DataError, load_prompts, render_prompt
from rlpost.data.tasks import TASKS, task_cache_name, task_format, task_rows, task_split
from rlpost.rewards import REWARDS
from rlpost.tiny.model import build_char_tokenizer

REPO = Path(__file__).resolve().parents[2]
CHAT_TASKS = ["sums_chat", "sums_steps"]

# sha256 of json.dumps([train, val]) at data.arithmetic_digits=2, val_size=256, operands=3,
# train_size=5000, by (task, format). Rows that change without a new format would be read from a
# stale cache: a change must bump the task's format and record its digest here.
PINNED = {
    ("arithmetic", 2): "6130c9e34b5ad588",
    ("multiply", 1): "335b90ad69e57209",
    ("sums_chat", 1): "93ec97018c7435c4",
    ("sums_steps", 1): "4cc2e03102c58e09",
}


def data(task: str, **kw) -> DataConfig:
    return replace(DataConfig(), task=task, **kw)


def digest(rows) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


# ------------------------------------------------------------------------------ registry
@pytest.mark.parametrize("task", sorted({t for t, _ in PINNED}))
def test_rows_of_each_format_are_pinned(task):
    train, val = task_rows(data(task))
    assert digest([train, val]) == PINNED.get((task, TASKS[task].format)), (
        f"{task}'s rows changed: bump its format (the cache key) and record the new digest in PINNED"
    )


def test_arithmetic_and_multiply_keep_their_rows_and_cache_names():
    """The tiny models and the quickstart are built from these rows and cached by these names."""
    assert task_cache_name(data("arithmetic")) == "arithmetic-d2-v256-f2"
    assert task_cache_name(data("multiply", arithmetic_digits=3, val_size=10)) == "multiply-d3-v10-f1"
    assert (task_format("arithmetic"), task_format("multiply")) == (2, 1)
    for task in ("arithmetic", "multiply"):
        assert task_split(task, 2, 256) == task_rows(data(task))
    train, val = task_rows(data("arithmetic"))
    assert (val[0], len(train)) == ({"prompt": "25+60=", "ground_truth": "085", "data_source": "arithmetic"}, 7844)


def test_config_and_cli_choices_come_from_the_registry():
    choices = dict(iter_fields())["data.task"].metadata["choices"]
    assert choices == ("", *TASKS) and {"sums_chat", "sums_steps", "reasoning_gym"} <= set(TASKS)
    for name, task in TASKS.items():
        assert f"`{name}` ({task.help})" in dict(iter_fields())["data.task"].metadata["help"]
    usage = subprocess.run(
        [sys.executable, "-m", "rlpost.cli", "data", "--help"], capture_output=True, text=True, cwd=REPO, timeout=120
    ).stdout
    assert "{" + ",".join(TASKS) + "}" in usage


def test_every_task_routes_to_a_registered_reward():
    for task in ["arithmetic", "multiply", *CHAT_TASKS]:
        train, val = task_rows(data(task, train_size=20, val_size=5))
        assert {r["data_source"] for r in train + val} <= set(REWARDS)
    assert {r["data_source"] for r in task_rows(data("sums_chat"))[0]} == {"last_number"}
    assert {r["data_source"] for r in task_rows(data("sums_steps"))[0]} == {"answer_line"}


def test_the_tiny_model_refuses_chat_tasks():
    assert tiny_model_task(compose(["data.task=sums_chat"])) is not None
    assert "model.path" in tiny_model_task(compose(["data.task=sums_steps"]))
    assert tiny_model_task(compose(["data.task=sums_chat", "model.path=smollm2-135m-instruct"])) is None
    assert tiny_model_task(compose(["data.task=multiply"])) is None


# ----------------------------------------------------------------------------- the chat tasks
def test_sums_chat_rows_are_the_arithmetic_pairs_as_a_chat_question():
    train, val = task_rows(data("sums_chat"))
    a_train, a_val = task_rows(data("arithmetic"))
    assert val[0] == {
        "prompt": [{"role": "user", "content": "What is 25+60? Reply with the number only."}],
        "ground_truth": "85",
        "data_source": "last_number",
    }
    assert [r["prompt"][0]["content"].split()[2] for r in train] == [r["prompt"].replace("=", "?") for r in a_train]
    assert [int(r["ground_truth"]) for r in val] == [int(r["ground_truth"]) for r in a_val]


def test_sums_steps_rows_add_the_numbers_of_their_question():
    train, val = task_rows(data("sums_steps", operands=4, arithmetic_digits=3, train_size=300, val_size=20))
    assert (len(train), len(val)) == (300, 20)
    for row in train + val:
        (message,) = row["prompt"]
        assert message["role"] == "user" and "'Answer: N'" in message["content"]
        expression = message["content"].removeprefix("What is ").split("?")[0]
        numbers = [int(x) for x in expression.split(" + ")]
        assert len(numbers) == 4 and all(100 <= n <= 999 for n in numbers)
        assert row["ground_truth"] == str(sum(numbers)) and row["data_source"] == "answer_line"


def problems(rows) -> list[tuple]:
    return [tuple(sorted(int(x) for x in r["prompt"][-1]["content"].split("?")[0][8:].split(" + "))) for r in rows]


@pytest.mark.parametrize(
    "settings",
    [
        dict(arithmetic_digits=2, operands=3, train_size=2000, val_size=100),  # sampled
        dict(arithmetic_digits=1, operands=3, train_size=5000, val_size=30),  # enumerated: 220 problems
    ],
)
def test_sums_steps_splits_share_no_problem_in_any_order(settings):
    train, val = task_rows(data("sums_steps", **settings))
    assert not set(problems(train)) & set(problems(val))
    assert len(set(problems(train + val))) == len(train + val)  # every problem once
    if settings["arithmetic_digits"] == 1:
        assert len(train) + len(val) == 220  # the whole space: 10 multichoose 3


def test_sums_steps_puts_operands_in_a_random_order():
    rows = task_rows(data("sums_steps", arithmetic_digits=1, operands=3, val_size=30))[0]
    orders = {tuple(int(x) for x in r["prompt"][0]["content"][8:].split("?")[0].split(" + ")) for r in rows}
    assert any(list(o) != sorted(o) for o in orders)


@pytest.mark.parametrize("digits, size", [(3, 3000), (1, 5000)])  # sampled; enumerated (2 to 4 numbers: 990)
def test_sums_steps_with_max_operands_draws_each_count_alike_and_shares_no_problem(digits, size):
    train, val = task_rows(data("sums_steps", arithmetic_digits=digits, operands=2, max_operands=4, train_size=size))
    counts = [len(p) for p in problems(train + val)]
    assert set(counts) == {2, 3, 4}
    if digits == 3:  # sampled: each count about a third
        assert all(abs(counts.count(k) / len(counts) - 1 / 3) < 0.03 for k in (2, 3, 4))
    else:  # the whole space: 55 + 220 + 715 problems of 2, 3 and 4 numbers
        assert len(counts) == 55 + 220 + 715
    assert not set(problems(train)) & set(problems(val))
    assert len(set(problems(train + val))) == len(train + val)


def test_sums_steps_max_operands_at_or_below_operands():
    fixed = task_rows(data("sums_steps", operands=3, train_size=300, val_size=20))
    assert task_rows(data("sums_steps", operands=3, max_operands=3, train_size=300, val_size=20)) == fixed
    with pytest.raises(DataError, match=r"data.max_operands=2 is below data.operands=3; raise it or 0"):
        task_rows(data("sums_steps", operands=3, max_operands=2, train_size=300, val_size=20))


@pytest.mark.parametrize("task", CHAT_TASKS)
def test_chat_task_rows_are_deterministic(task):
    settings = dict(train_size=500, val_size=50)
    assert task_rows(data(task, **settings)) == task_rows(data(task, **settings))


@pytest.mark.parametrize(
    "task, changes",
    [
        ("sums_chat", [dict(arithmetic_digits=3), dict(val_size=100)]),
        (
            "sums_steps",
            [dict(arithmetic_digits=3), dict(val_size=100), dict(operands=4), dict(train_size=100)]
            + [dict(max_operands=9)],
        ),
    ],
)
def test_cache_names_change_with_every_setting_that_changes_the_rows(task, changes, monkeypatch):
    base = data(task, train_size=400, val_size=40)
    names = {task_cache_name(base)}
    for change in changes:
        changed = replace(base, **change)
        assert task_rows(changed) != task_rows(base)
        names.add(task_cache_name(changed))
    assert len(names) == len(changes) + 1
    assert task_cache_name(replace(base, shuffle=False, gym=replace(base.gym, name="x"))) == task_cache_name(base)
    fmt = {"sums_chat": "SUMS_CHAT_FORMAT", "sums_steps": "SUMS_STEPS_FORMAT"}[task]
    monkeypatch.setattr(chat_tasks, fmt, getattr(chat_tasks, fmt) + 1)
    assert task_cache_name(base) not in names


@pytest.mark.parametrize("task", CHAT_TASKS)
def test_chat_prompts_go_through_the_chat_template(task, tmp_path, tokenizer):
    train, val = task_rows(data(task, train_size=50, val_size=5))
    question = val[0]["prompt"][-1]["content"]
    rendered = render_prompt(val[0]["prompt"], tokenizer)
    assert question in rendered and rendered != question and rendered.endswith("assistant: ")
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in val))
    loaded = load_prompts([str(path)], tokenizer, 512).rows
    assert loaded[0].prompt_text == rendered and loaded[0].prompt_ids == tokenizer(rendered).input_ids
    assert loaded[0].ground_truth == val[0]["ground_truth"]
    check_reward_routing(loaded, "auto")  # the data_source has a reward


def test_impossible_splits_name_the_keys():
    with pytest.raises(DataError, match="data.val_size"):
        task_rows(data("sums_chat", arithmetic_digits=1, val_size=100))
    with pytest.raises(DataError, match=r"data.val_size=300 must be in 1..219"):
        task_rows(data("sums_steps", arithmetic_digits=1, operands=3, val_size=300))
    with pytest.raises(DataError, match="data.operands"):
        chat_tasks.sums_steps_split(2, 1, 10, 5)


# ------------------------------------------------------------------------ cached, and the CLI
def test_a_run_caches_the_rows_by_their_settings(tmp_path):
    cfg = compose(["data.task=sums_steps", f"model.cache_dir={tmp_path}", "data.train_size=40", "data.val_size=8"])
    train_src, val_src = data_sources(cfg)
    folder = Path(val_src[0]).parent
    assert folder == tmp_path / "data" / "sums_steps-d2-k3-n40-v8-f1"
    assert [json.loads(line) for line in Path(val_src[0]).read_text().splitlines()] == task_rows(cfg.data)[1]
    made = {n: (folder / n).stat().st_mtime_ns for n in ("train.jsonl", "val.jsonl")}
    assert data_sources(cfg) == (train_src, val_src)  # a complete copy is read, not made again
    assert {n: (folder / n).stat().st_mtime_ns for n in made} == made
    # cut at a line's end (the ninth catalogue's n75: trained on part of the rows without a word)
    lines = (folder / "train.jsonl").read_text().splitlines(keepends=True)
    (folder / "train.jsonl").write_text("".join(lines[:10]))
    assert data_sources(cfg) == (train_src, val_src)
    assert (folder / "train.jsonl").read_text() == "".join(lines)  # made again, whole
    assert sorted(p.name for p in folder.iterdir()) == ["sizes.json", "train.jsonl", "val.jsonl"]  # no temporary
    cfg.data.operands = 4
    assert Path(data_sources(cfg)[1][0]).parent != folder


def test_cli_writes_a_task_with_data_settings(tmp_path):
    def run(*args):
        cmd = [sys.executable, "-m", "rlpost.cli", "data", *args]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)

    done = run("sums_steps", "--out", str(tmp_path), "data.operands=4", "data.train_size=30", "--num-val", "7")
    assert done.returncode == 0, done.stderr
    val = [json.loads(line) for line in (tmp_path / "val.jsonl").read_text().splitlines()]
    assert val == task_rows(data("sums_steps", operands=4, train_size=30, val_size=7))[1]
    bad = run("sums_steps", "--out", str(tmp_path), "data.operands=1")
    assert bad.returncode == 2 and "data.operands=1 must be >= 2" in bad.stderr and "Traceback" not in bad.stderr
    other = run("sums_chat", "--out", str(tmp_path), "model.path=x")
    assert other.returncode == 2 and "data.KEY=VALUE" in other.stderr


def test_a_full_disk_leaves_no_part_written(tmp_path, monkeypatch):
    """The eleventh catalogue's t78: `rlpost data ... --out DIR` on a full disk left a hidden
    `.train.jsonl.XXXX.tmp` holding the space."""
    import tempfile

    from rlpost.data.tasks import write_atomic

    made = tempfile.NamedTemporaryFile

    class Full:
        def __init__(self, *a, **kw):
            self.f = made(*a, **kw)
            self.name = self.f.name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[:10])
            self.f.flush()
            raise OSError(28, "No space left on device")

        def flush(self):
            self.f.flush()

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", Full)
    with pytest.raises(OSError, match="No space"):
        write_atomic("x" * 1000, tmp_path / "data" / "train.jsonl")
    assert list((tmp_path / "data").iterdir()) == []
