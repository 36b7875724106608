"""controller/setup.py's checks one at a time, on files in a temporary folder: what `load_data`
hands the loop, how a user's environment and reward function are tried, and where the critic's
and the reward model's weights come from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller import reward_checks
from rlpost.controller.reward_checks import check_reward_values
from rlpost.controller.setup import (
    check_env,
    check_lora_targets,
    check_reward_routing,
    check_row_counts,
    data_sources,
    env_tools,
    load_data,
    own_scorer,
    resolve_critic_path,
    resolve_reward_model_path,
)
from rlpost.data.dataset import DataError, PromptRow, read_rows
from rlpost.data.tasks import task_rows
from rlpost.tiny.model import TOOL_CHARS, build_char_tokenizer
from tests.helpers import save_tiny_model

OWN = ["+recipe=quickstart", "data.task=", "data.train_files=[t.jsonl]", "data.train_batch_size=4"]
OWN += ["data.max_prompt_length=8", "data.default_data_source=arithmetic"]
ENV = """
from rlpost.envs import EnvStep


class Tool:
    def __init__(self, schema):
        self.schema = schema


class Env:
    def __init__(self, row, options):
        self.tools = [Tool({"name": "look", "row": [row.prompt_text, row.ground_truth, row.data_source]})]
        self.turns = options.max_turns

    def step(self, turn):
        return EnvStep(done=True)


def make(row, options):
    return Env(row, options)


def refuse(row, options):
    raise RuntimeError(repr((row.prompt_text, row.ground_truth, row.data_source, options.max_turns)))


def number(row, options):
    return 5
"""


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def own_data(tmp_path, train: list[dict], val: list[dict], *overrides: str):
    t, v = write_rows(tmp_path / "t.jsonl", train), write_rows(tmp_path / "v.jsonl", val)
    return load_config([*OWN, f"data.train_files=[{t}]", f"data.val_files=[{v}]", *overrides], this_machine=False)


def sums(n: int, start: int = 0) -> list[dict]:
    return [{"prompt": f"{i}+1=", "ground_truth": str(i + 1)} for i in range(start, start + n)]


def test_load_data_counts_the_prompts_too_long_in_both_files_and_says_what_it_kept(tmp_path):
    long = {"prompt": "1+2+3+4+5=", "ground_truth": "15"}  # 10 tokens, over data.max_prompt_length=8
    cfg = own_data(tmp_path, [*sums(4), long], [long, *sums(1, start=7), long], "data.default_data_source=gsm8k")
    said = []
    loader, val_rows, dropped = load_data(cfg, build_char_tokenizer(), log=said.append)
    assert dropped == 3  # 1 + 2
    assert said == [
        "dropped 3 prompts longer than data.max_prompt_length=8 tokens",
        "data: 4 training prompts, 1 validation prompts",
    ]
    assert [(r.prompt_text, r.data_source) for r in val_rows] == [("7+1=", "gsm8k")]
    assert {r.data_source for r in next(loader)} == {"gsm8k"}  # the default, in the training rows too


def test_load_data_batches_by_the_batch_size_and_shuffles_by_the_seed_only_when_asked(tmp_path):
    def first_epoch(*overrides):
        cfg = own_data(tmp_path, sums(8), sums(1), *overrides)
        loader = load_data(cfg, build_char_tokenizer(), log=lambda *_: None)[0]
        batches = [next(loader), next(loader)]
        assert [len(b) for b in batches] == [4, 4]
        return [r.prompt_text for b in batches for r in b]

    in_order = [f"{i}+1=" for i in range(8)]
    assert first_epoch("data.shuffle=false", "run.seed=1") == in_order
    one, two = first_epoch("run.seed=1"), first_epoch("run.seed=2")
    assert sorted(one) == sorted(two) == sorted(in_order)
    assert one != in_order and two != in_order and one != two


def test_load_data_refuses_an_empty_answer_that_rlposts_scorer_would_compare_with(tmp_path):
    empty = {"prompt": "1+1=", "ground_truth": " ", "data_source": "arithmetic"}
    tok = build_char_tokenizer()
    cfg = own_data(tmp_path, [*sums(4), empty], sums(1))
    with pytest.raises(DataError, match=r"t.jsonl: row 4: field 'ground_truth' is empty, and reward 'arithmetic' "):
        load_data(cfg, tok, log=lambda *_: None)
    cfg = own_data(tmp_path, sums(4), [empty], "reward.fn=gsm8k")
    with pytest.raises(DataError, match=r"v.jsonl: row 0: field 'ground_truth' is empty, and reward 'gsm8k' "):
        load_data(cfg, tok, log=lambda *_: None)


def test_load_data_names_the_files_and_the_unscored_source_it_refuses(tmp_path):
    cfg = own_data(tmp_path, sums(2), sums(1))
    with pytest.raises(DataError, match=rf"^data.train_files=\['{tmp_path}/t.jsonl'\] gave 2 training prompts"):
        load_data(cfg, build_char_tokenizer(), log=lambda *_: None)
    odd = [{**row, "data_source": "nosuch"} for row in sums(4)]
    cfg = own_data(tmp_path, odd, sums(1))
    with pytest.raises(DataError, match=r"^reward.fn=auto has no reward function for data_source 'nosuch'; "):
        load_data(cfg, build_char_tokenizer(), log=lambda *_: None)


def test_load_data_advertises_the_environments_tools_in_chat_prompts_of_both_files(tmp_path):
    (tmp_path / "env.py").write_text(ENV)
    chat = [{"prompt": [{"role": "user", "content": f"{i}+1="}], "ground_truth": str(i + 1)} for i in range(4)]
    cfg = own_data(
        tmp_path,
        chat,
        chat[:1],
        f"env.name={tmp_path}/env.py:make",
        "data.max_prompt_length=512",
        "model.tiny.max_position=600",
    )
    tok = build_char_tokenizer(extra_chars=TOOL_CHARS)
    tok.chat_template = (
        "{% if tools %}tools: {{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant: "
    )
    loader, val_rows, _ = load_data(cfg, tok, log=lambda *_: None)
    for row in [*next(loader), *val_rows]:
        assert row.prompt_text.startswith('tools: [{"name": "look", "row": ["[{\\"role\\": \\"user\\"')
        assert row.prompt_text.endswith("\nassistant: ")


def test_the_environment_is_made_from_the_first_training_row_with_the_env_options(tmp_path):
    (tmp_path / "env.py").write_text(ENV)
    train = [{"prompt": "1+1=", "ground_truth": "2", "data_source": "arithmetic"}, *sums(3, start=5)]
    cfg = own_data(tmp_path, train, sums(1), f"env.name={tmp_path}/env.py:refuse", "env.max_turns=3")
    with pytest.raises(ConfigError) as info:
        load_data(cfg, build_char_tokenizer(), log=lambda *_: None)
    assert str(info.value) == (
        f"env.name='{tmp_path}/env.py:refuse': making the environment of the first training row raised "
        "RuntimeError: ('1+1=', '2', 'arithmetic', 3)"
    )
    row = PromptRow([1], "1+1=", "2", "arithmetic")
    check_env(load_config([*OWN, f"env.name={tmp_path}/env.py:make"], this_machine=False), row)  # an environment
    with pytest.raises(ConfigError) as info:
        check_env(load_config([*OWN, f"env.name={tmp_path}/env.py:number"], this_machine=False), row)
    assert str(info.value) == (
        f"env.name='{tmp_path}/env.py:number': the factory returned int, not an environment (an object with a "
        "step(turn) method and a tools list: docs/environments.md)"
    )


def test_env_tools_make_the_rows_environment_from_its_prompt_answer_and_source(tmp_path):
    (tmp_path / "env.py").write_text(ENV)
    cfg = load_config([*OWN, f"env.name={tmp_path}/env.py:make", "data.default_data_source=gsm8k"])
    tools_of = env_tools(cfg)
    messages = [{"role": "user", "content": "1+1="}]
    assert tools_of({"prompt": messages, "ground_truth": "2", "data_source": None}) == [
        {"name": "look", "row": [json.dumps(messages), "2", "gsm8k"]}
    ]
    assert tools_of({"prompt": "1+1=", "ground_truth": "2", "data_source": "arithmetic"}) == [
        {"name": "look", "row": ["1+1=", "2", "arithmetic"]}
    ]
    assert env_tools(load_config(OWN, this_machine=False)) is None  # single-turn: no tools


def test_own_scorer_names_rlposts_scorer_of_a_row_or_none_for_the_users_function():
    assert own_scorer("auto", "arithmetic") == "arithmetic"  # routed by the row's data_source
    assert own_scorer("gsm8k", "arithmetic") == "gsm8k"  # named: it scores every row
    assert own_scorer("auto", "mine") is None  # no scorer of rlpost's for that source
    assert own_scorer("my_reward.py:score", "arithmetic") is None


def test_row_counts_name_the_task_when_the_rows_are_a_tasks():
    cfg = load_config(["+recipe=quickstart", "data.train_batch_size=4"], this_machine=False)
    with pytest.raises(DataError) as info:
        check_row_counts(cfg, ["t.jsonl"], 2, ["v.jsonl"], 8)
    assert str(info.value) == (
        "data.task='arithmetic' gave 2 training prompts (after data.max_prompt_length=16), fewer than "
        "data.train_batch_size=4: give more rows or a smaller batch"
    )
    with pytest.raises(DataError, match=r"^data.task='arithmetic' gave no validation prompts, which trainer.val_"):
        check_row_counts(cfg, ["t.jsonl"], 8, ["v.jsonl"], 0)


def test_rows_without_a_data_source_under_auto_are_said_to_lack_one():
    with pytest.raises(DataError) as info:
        check_reward_routing([PromptRow([1], "1+1=", "2", "")], "auto")
    assert str(info.value).startswith("reward.fn=auto has no reward function for rows without a data_source; set ")


def test_a_tasks_rows_are_written_where_data_sources_says(tmp_path):
    cfg = load_config(
        ["+recipe=quickstart", f"model.cache_dir={tmp_path}", "data.val_size=8"],
        this_machine=False,
    )
    (train,), (val,) = data_sources(cfg)
    assert (read_rows(train), read_rows(val)) == task_rows(cfg.data)


def test_lora_targets_are_checked_at_rank_1(tmp_path):
    save_tiny_model(tmp_path / "m")
    cfg = load_config([*OWN, "model.lora.rank=1", "model.lora.target_modules=[qproj]"], this_machine=False)
    with pytest.raises(ConfigError, match=r"^model.lora.target_modules=\['qproj'\]: \['qproj'\] names no layer"):
        check_lora_targets(cfg, str(tmp_path / "m"))


def test_rlposts_own_scorers_are_not_tried_in_a_reward_worker(monkeypatch):
    def no_pool(*args):
        raise AssertionError(f"a reward pool was started for {args[0]}")

    monkeypatch.setattr(reward_checks, "RewardPool", no_pool)
    row = PromptRow([1], "1+1=", "2", "arithmetic")
    check_reward_values(load_config(OWN, this_machine=False), [row])  # auto: the row's source is rlpost's
    named = load_config([*OWN, "reward.fn=gsm8k"], this_machine=False)
    check_reward_values(named, [PromptRow([1], "1+1=", "2", "mine")])  # named: it scores every source


def test_a_users_reward_function_is_tried_on_the_first_row_its_answer_as_the_response(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("def score(s):\n    raise ValueError(repr((s.prompt, s.response, s.ground_truth, s.data_source)))")
    train = [{**row, "data_source": "mine"} for row in sums(4, start=6)]
    cfg = own_data(tmp_path, train, sums(1), f"reward.fn={path}:score")
    said = []
    load_data(cfg, build_char_tokenizer(), log=said.append)
    assert said[0] == (
        f"warning: reward.fn='{path}:score' on a first try (a training row, its ground truth '7' as the response) "
        "failed: ValueError: ('6+1=', '7', '7', 'mine'); such samples score reward.error_score"
    )


def fake_gguf(monkeypatch, converted: list):
    def ensure_converted(path, cache_dir, log):
        converted.append((path, cache_dir, log))
        return Path(cache_dir) / "converted"

    monkeypatch.setattr("rlpost.models.gguf.ensure_converted", ensure_converted)


def test_the_critic_starts_from_the_policy_unless_critic_model_path_is_set(tmp_path, monkeypatch):
    cfg = load_config(["+recipe=ppo", f"model.cache_dir={tmp_path}/cache"], this_machine=False)
    assert resolve_critic_path(cfg, "/the/policy") == "/the/policy"
    (tmp_path / "value").mkdir()
    cfg.critic.model_path = str(tmp_path / "value")
    assert resolve_critic_path(cfg, "/the/policy") == str(tmp_path / "value")
    converted = []
    fake_gguf(monkeypatch, converted)
    cfg.critic.model_path = "value.gguf"  # converted into model.cache_dir, as the policy's would be
    assert resolve_critic_path(cfg, "/the/policy") == f"{tmp_path}/cache/converted"
    assert converted[0][:2] == ("value.gguf", f"{tmp_path}/cache")


def test_a_reward_model_path_is_resolved_like_a_models(tmp_path, monkeypatch):
    cfg = load_config(["+recipe=quickstart", f"model.cache_dir={tmp_path}/cache"], this_machine=False)
    cfg.reward.model.path = "some-org/some-rm"
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # (no network probe for a hub id)
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda repo, name: "/cache/config.json")
    assert resolve_reward_model_path(cfg, "/the/policy") == "some-org/some-rm"  # a hub id (cached), as it is
    converted, said = [], []
    fake_gguf(monkeypatch, converted)
    cfg.reward.model.path = "rm.gguf"
    assert resolve_reward_model_path(cfg, "/the/policy", said.append) == f"{tmp_path}/cache/converted"
    assert converted == [("rm.gguf", f"{tmp_path}/cache", said.append)]


def test_the_tiny_reward_model_is_built_from_the_tiny_policy_on_the_device_asked_for(tmp_path, monkeypatch):
    import torch

    built = []

    def policy(model, data, device, log):
        built.append(("policy", model.path, data.arithmetic_digits, device, log))
        return tmp_path / "policy"

    def reward_model(policy_dir, digits, val_size, device, log):
        built.append(("rm", policy_dir, digits, val_size, device, log))
        return tmp_path / "rm"

    monkeypatch.setattr("rlpost.tiny.build.ensure_tiny_model", policy)
    monkeypatch.setattr("rlpost.tiny.reward.ensure_tiny_reward_model", reward_model)
    cfg = load_config(["+recipe=quickstart", "data.arithmetic_digits=1", "data.val_size=20"], this_machine=False)
    cfg.reward.model.path, log = "tiny", print
    for device, available, on in [("cpu", True, "cpu"), ("cuda", True, "cuda"), ("cuda", False, "cpu")]:
        cfg.trainer.device = device
        monkeypatch.setattr(torch.cuda, "is_available", lambda available=available: available)
        built.clear()
        assert resolve_reward_model_path(cfg, "/the/policy", log) == str(tmp_path / "rm")
        assert built == [("rm", "/the/policy", 1, 20, on, log)]  # model.path=tiny: the policy given
    cfg.model.path = "tiny-but-not-named-so"
    built.clear()
    assert resolve_reward_model_path(cfg, "/the/policy", log) == str(tmp_path / "rm")
    assert built == [
        ("policy", "tiny-but-not-named-so", 1, "cpu", log),  # the tiny policy built first
        ("rm", str(tmp_path / "policy"), 1, 20, "cpu", log),
    ]
