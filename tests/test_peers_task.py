"""benchmarks/peers (issue 43): TRL and verl get exactly rlpost's `smollm2_sums` task. The exported rows
are rlpost's own (the held-out rows in its order, the training rows in the order its loader draws
them for the seed), in rlpost's jsonl format and verl's parquet layout, and the peers' reward module
scores as rlpost's `last_number` does. Needs neither TRL nor verl."""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_benchmark

STEPS = 3


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """export_task.py's folder for seed 0 (3 batches), and rlpost's own rows and config."""
    from rlpost.config import load_config
    from rlpost.data.tasks import task_rows

    tmp = tmp_path_factory.mktemp("peers")
    export = load_benchmark("benchmarks/peers/export_task.py")
    overrides = [f"model.cache_dir={tmp / 'cache'}"]
    record = export.export(tmp / "task", 0, STEPS, overrides)
    cfg = load_config(["+recipe=smollm2_sums", *overrides], this_machine=False)
    train, val = task_rows(cfg.data)
    return tmp / "task", record, cfg, train, val


def jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def fields(row: dict) -> tuple:
    return json.dumps(row["prompt"]), str(row["ground_truth"]), row["data_source"]


def test_the_validation_rows_are_rlposts_in_its_order(exported):
    folder, record, _, _, val = exported
    assert [fields(r) for r in jsonl(folder / "val.jsonl")] == [fields(r) for r in val]
    assert record["val_rows"] == len(val) == 256


def test_the_training_rows_are_the_batches_rlposts_loader_draws_for_the_seed(exported):
    from rlpost.data.dataset import PromptLoader

    folder, record, cfg, train, _ = exported
    loader = PromptLoader(train, cfg.data.train_batch_size, 0, cfg.data.shuffle)
    batches = [row for _ in range(STEPS) for row in next(loader)]
    assert [fields(r) for r in jsonl(folder / "train_s0.jsonl")] == [fields(r) for r in batches]
    assert record["train_rows_written"] == STEPS * 64 and record["train_rows"] == len(train)
    assert batches[0]["prompt"] == [{"role": "user", "content": batches[0]["prompt"][0]["content"]}]


def test_the_parquet_files_hold_the_same_rows_in_verls_layout(exported):
    import pyarrow.parquet as pq

    folder = exported[0]
    for stem in ("train_s0", "val"):
        table = pq.read_table(folder / f"{stem}.parquet").to_pylist()
        assert set(table[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        as_rlpost = [
            {"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"], "data_source": r["data_source"]}
            for r in table
        ]
        assert [fields(r) for r in as_rlpost] == [fields(r) for r in jsonl(folder / f"{stem}.jsonl")]
        assert [r["extra_info"]["index"] for r in table] == list(range(len(table)))


def test_the_settings_are_the_recipes(exported):
    folder, record, cfg, _, _ = exported
    s = record["settings"]
    assert (s["prompts_per_step"], s["group_size"], s["max_response_length"]) == (64, 8, 128)
    assert (s["lr"], s["warmup_steps"], s["kl_coef"], s["loss_agg_mode"]) == (1e-5, 5, 0.0, "token-mean")
    assert (s["rollout_is"], s["grad_clip"], s["dtype"]) == (cfg.algo.rollout_is, 1.0, "bfloat16")
    env = dict(line.split("=", 1) for line in (folder / "task.env").read_text().splitlines())
    assert env["TASK_GROUP_SIZE"] == "8" and env["TASK_LOSS_AGG_MODE"] == '"token-mean"'


def test_another_seed_draws_other_batches_of_the_same_rows(exported, tmp_path):
    folder, _, _, _, _ = exported
    export = load_benchmark("benchmarks/peers/export_task.py")
    export.export(tmp_path, 1, STEPS, [f"model.cache_dir={folder.parent / 'cache'}"])
    seed0, seed1 = jsonl(folder / "train_s0.jsonl"), jsonl(tmp_path / "train_s1.jsonl")
    assert seed0 != seed1 and len(seed0) == len(seed1)


RESPONSES = ["68", "The answer is 68.", "68.0", "068", "+68", "1,068", "67 + 1 = 68", "68 or 69", "", "sixty-eight",
             "-68", "68\n", "It is 6 8", "68!", "$68", "6.8e1"]  # fmt: skip


def test_the_reward_is_rlposts_last_number_for_verl_and_trl():
    from rlpost.rewards import REWARDS, RewardInput

    reward = load_benchmark("benchmarks/peers/sums_reward.py")
    ours = [REWARDS.get("last_number")(RewardInput("p", r, "68", "last_number")) for r in RESPONSES]
    assert 0.0 in ours and 1.0 in ours
    assert [reward.compute_score("last_number", r, "68", {"index": 0}) for r in RESPONSES] == ours

    class Tokenizer:  # completion ids are the responses' indices; decoded as rlpost decodes (specials dropped)
        def batch_decode(self, ids, skip_special_tokens):
            assert skip_special_tokens
            return [RESPONSES[i[0]] for i in ids]

    n = len(RESPONSES)
    trl = reward.trl_reward(Tokenizer())
    got = trl(prompts=[None] * n, completions=[None] * n, completion_ids=[[i, 0] for i in range(n)],
              ground_truth=["68"] * n, data_source=["last_number"] * n)  # fmt: skip
    assert got == ours and reward.STATS["completions"] >= n
