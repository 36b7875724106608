"""Faults the seventeenth bad-input catalogue found (tries by someone who did not write the code, on
204e4c2 onwards; /work/cat17_report.md): each test here fails on the code before its fix."""

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller.reward_checks import check_reward_values
from rlpost.data.dataset import PromptRow

ROW = PromptRow([1], "2+2=", "4", "arithmetic")


def first_try(tmp_path, body: str, *overrides: str):
    (tmp_path / "r.py").write_text(body)
    cfg = load_config(["+recipe=quickstart", f"reward.fn={tmp_path / 'r.py'}:score", *overrides])
    said: list[str] = []
    check_reward_values(cfg, [ROW], said.append)
    return said


@pytest.mark.parametrize(
    "body, last",
    [  # t47: a field RewardInput lacks; t42: a process pool in the worker; a name never defined; a missing module
        ("def score(s):\n    return float(s.answer == s.response)\n", "'RewardInput' object has no attribute 'answer'"),
        (
            "import multiprocessing\n\ndef score(s):\n    with multiprocessing.Pool(1) as p:\n        return 1.0\n",
            "daemonic processes are not allowed to have children",
        ),
        ("def score(s):\n    return float(ground_truth == s.response)\n", "NameError: name 'ground_truth' is not"),
        ("def score(s):\n    import no_such_module_x\n    return 1.0\n", "No module named 'no_such_module_x'"),
    ],
)
def test_a_first_try_that_fails_whatever_the_response_stops_the_run_before_the_actors(tmp_path, body, last):
    """t42, t47: the first try's failure was only warned of, and the run started Ray and the actors
    and trained every step on samples that all failed to score."""
    with pytest.raises(ConfigError) as info:
        first_try(tmp_path, body)
    assert f"reward.fn='{tmp_path / 'r.py'}:score' on a first try" in str(info.value) and last in str(info.value)
    assert str(info.value).endswith(
        "This fails whatever the response (a sample has prompt, response, ground_truth, data_source)"
    )


def test_a_first_try_that_fails_on_the_response_is_still_only_said(tmp_path):
    """A function that fails on some responses (here: one it cannot parse) goes on, counted."""
    said = first_try(tmp_path, "def score(s):\n    return float(int(s.response.split()[1]))\n")
    assert len(said) == 1 and said[0].startswith("warning: ") and "IndexError" in said[0]


def test_a_memory_error_under_the_cap_names_the_cap(tmp_path):
    """t44, t44b: a reward asking for 6 GiB under reward.memory_mb=4096 failed with a bare
    `MemoryError` on every sample, after the actors started; now it stops at the first try, naming the cap."""
    with pytest.raises(ConfigError) as info:
        first_try(tmp_path, "def score(s):\n    b = bytearray(6 * 1024**3)\n    return 1.0\n", "reward.memory_mb=4096")
    assert "MemoryError (each worker process may use reward.memory_mb=4096 MiB of address space: raise it, or 0" in str(
        info.value
    )


def test_tiny_keys_beside_a_model_folder_are_said_to_be_unused():
    """t05: `model.tiny.hidden_size=64` with `model.path` a folder trained the folder's model without
    a word. Said, not refused: gpu_quickstart sets them for its tiny model and may be given another."""
    from rlpost.controller.alerts import tiny_keys_warning

    cfg = load_config(["+recipe=quickstart", "model.path=org/model", "model.tiny.hidden_size=64"], this_machine=False)
    assert tiny_keys_warning(cfg) == (
        "warning: model.tiny.hidden_size=64: read only when model.path=tiny builds the tiny model, and "
        "model.path=org/model: they are not used"
    )
    assert tiny_keys_warning(load_config(["+recipe=quickstart", "model.path=org/model"], this_machine=False)) is None
    assert tiny_keys_warning(load_config(["+recipe=quickstart", "model.tiny.hidden_size=64"])) is None  # tiny: read


@pytest.mark.parametrize(
    "override, said",
    [  # t13: a / for the dot; t15: YAML's colon; t19: Hydra's own settings in a value
        ("trainer/total_steps=3", "'trainer/total_steps=3': write trainer.total_steps=3 (rlpost's keys are joined"),
        ("trainer.total_steps:3", "'trainer.total_steps:3': write KEY=VALUE, not KEY:VALUE: trainer.total_steps=3"),
        ("run.dir=runs/${hydra:job.num}", "${hydra:...} reads Hydra's own run settings, which rlpost does not use"),
    ],
)
def test_overrides_in_another_tools_form_are_named(override, said):
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", override], this_machine=False)
    assert str(info.value).startswith(said) or said in str(info.value), str(info.value)


def test_a_file_name_cut_at_its_comma_is_named_with_the_quoting_that_keeps_it(tmp_path, monkeypatch):
    """t29: `data.train_files=[/x/with,comma.jsonl]` (unquoted) was "/x/with: no such file"."""
    from rlpost.controller.setup import data_sources

    (tmp_path / "with,comma.jsonl").write_text('{"prompt": "1+1=", "ground_truth": "2"}\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_config(["+recipe=quickstart", "data.task=", "data.train_files=[with,comma.jsonl]"], this_machine=False)
    with pytest.raises(ConfigError) as info:
        data_sources(cfg)
    assert str(info.value) == (
        "data.train_files: 'with', 'comma.jsonl' are one file, with,comma.jsonl, cut at its comma: quote its name: "
        "\"data.train_files=['with,comma.jsonl']\""
    )
    cfg = load_config(["+recipe=quickstart", "data.task=", "data.train_files=['with,comma.jsonl']"], this_machine=False)
    assert data_sources(cfg)[0] == ["with,comma.jsonl"]


def test_a_chat_prompt_that_ends_with_the_assistant_is_continued():
    """t30b: a prefill (`[user, assistant "The answer is"]`) was closed as a turn and a new assistant
    turn opened after it: the model never continued it."""
    from rlpost.data.dataset import render_prompt
    from rlpost.tiny.model import build_char_tokenizer

    tok = build_char_tokenizer()
    prefill = [{"role": "user", "content": "Add."}, {"role": "assistant", "content": "The answer is"}]
    assert render_prompt(prefill, tok) == "user: Add.\nassistant: The answer is"
    assert render_prompt(prefill[:1], tok) == "user: Add.\nassistant: "  # a new turn, as before


@pytest.mark.parametrize("name, what", [("r.pyc", "compiled Python"), ("", "a folder"), ("notpy", "not a .py file")])
def test_a_reward_path_that_is_not_python_source_is_named_as_a_path(tmp_path, name, what):
    """t51-t53: `reward.fn=/x/r.pyc:score` (a folder, a file without .py) was "not a registered reward"."""
    from rlpost.rewards.base import check_reward_fn

    path = tmp_path / name if name else tmp_path
    if name:
        path.write_text("def score(s):\n    return 1.0\n")
    with pytest.raises(ValueError) as info:
        check_reward_fn(f"{path}:score")
    assert str(info.value) == (
        f"reward.fn='{path}:score': {path} is {what}; give the function's .py source: path/to/file.py:NAME"
    )


def test_an_encoder_model_is_refused_before_the_actors(tmp_path):
    """t79: a BERT folder (`model_type: bert`) passed the start; the actors loaded it (110 lines of
    transformers' report) and died on "cannot find the decoder layers of BertLMHeadModel"."""
    from transformers import BertConfig

    from rlpost.controller.setup import check_weights

    BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64).save_pretrained(
        tmp_path
    )
    cfg = load_config(["+recipe=quickstart"], this_machine=False)
    cfg.model.path = str(tmp_path)
    with pytest.raises(ConfigError) as info:
        check_weights(cfg, str(tmp_path))
    assert str(info.value) == (
        f"model.path='{tmp_path}': its config.json makes a BertLMHeadModel (model_type bert), whose decoder layers "
        "rlpost does not find (model.layers, transformer.h or model.decoder.layers): rlpost trains decoder-only "
        "causal LMs such as Qwen2 and Llama"
    )


def test_a_model_folder_without_tokenizer_files_is_named(tmp_path):
    """t82: transformers 5 built an empty tokenizer from config.json's model_type, every prompt became
    no tokens, and rlpost blamed its own cached task file: "row 0: field 'prompt' is empty"."""
    from rlpost.models.loading import ModelFileError, load_tokenizer
    from tests.helpers import save_tiny_model

    save_tiny_model(tmp_path, hidden=32, intermediate=64)
    assert load_tokenizer(str(tmp_path)).get_vocab()  # as saved: a vocabulary
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (tmp_path / name).unlink(missing_ok=True)
    with pytest.raises(ModelFileError) as info:
        load_tokenizer(str(tmp_path))
    assert str(info.value).startswith(f"{tmp_path} has no tokenizer files (tokenizer.json, tokenizer_config.json")


def test_an_export_of_a_tiny_run_whose_cache_is_gone_makes_no_warm_up(tmp_path, capsys):
    """t87: with model.cache_dir cleaned, `rlpost export` built the tiny model again with its warm-up
    (1200 steps: over 5 minutes here) to export weights the checkpoint holds, every one of them."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM

    from rlpost.cli import main
    from rlpost.config import to_yaml
    from rlpost.controller.checkpoint import save
    from rlpost.roles.actor import ActorWorker
    from rlpost.tiny.build import untrained_tiny
    from rlpost.weightsync.transport import free_port

    run, cache = tmp_path / "run", tmp_path / "cache"  # the cache: empty, as after a clean-up
    cfg = load_config(["+recipe=quickstart", f"model.cache_dir={cache}", f"run.dir={run}", "data.train_batch_size=8"])
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(cfg))
    model, tokenizer = untrained_tiny(cfg.model, cfg.data)  # the run's model, trained below
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    worker = ActorWorker(cfg, str(tmp_path / "base"), 0, 1, "127.0.0.1", free_port())
    try:
        with torch.no_grad():
            for p in worker.model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        trained = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
        save(run, 2, {"step": 2}, [SimpleNamespace(call=lambda m, *a: getattr(worker, m)(*a))], keep=0)
    finally:
        worker.shutdown()
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert "made again without the warm-up (the checkpoint holds every weight)" in capsys.readouterr().out
    exported = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "hf").named_parameters())
    assert exported.keys() == trained.keys() and all(torch.equal(exported[n], trained[n]) for n in trained)
    assert not cache.exists() or not any(cache.iterdir())  # nothing built into the cache


def test_a_negative_rule_weight_with_nothing_to_weigh_it_against_is_refused():
    """t118: `reward.rule_weight=-1` without a reward model trained the model to be wrong, without a word."""
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", "reward.rule_weight=-1"], this_machine=False)
    assert "reward.rule_weight=-1 and no weighted reward model: the run would be rewarded for wrong answers" in str(
        info.value
    )


def test_a_tool_env_given_a_plain_function_names_the_decorator():
    """t122: `ToolEnv([adder], options)` with `adder` not decorated: "'function' object has no attribute 'name'"."""
    from rlpost.config.sections import EnvConfig
    from rlpost.envs import ToolEnv

    def adder(a: int, b: int) -> str:
        return str(a + b)

    with pytest.raises(TypeError) as info:
        ToolEnv([adder], EnvConfig())
    assert str(info.value) == (
        "ToolEnv's tools are made with @tool (from rlpost.envs import tool): adder is a function, not a Tool: put "
        "@tool above its def"
    )


@pytest.mark.parametrize("answer", ["None", '{"messages": [], "done": True}'])
def test_an_environment_whose_step_answers_no_envstep_stops_the_run_at_its_first_try(tmp_path, answer):
    """t121, t123: a `step` returning None (a forgotten return) or a dict passed the start; every episode of
    every step ended on the error, and the run exited 0."""
    from rlpost.controller.setup import check_env

    (tmp_path / "env.py").write_text(
        f"class E:\n    tools = []\n\n    def step(self, turn):\n        return {answer}\n\n\n"
        "def factory(row, options):\n    return E()\n"
    )
    cfg = load_config(["+recipe=quickstart", f"env.name={tmp_path / 'env.py'}:factory"], this_machine=False)
    with pytest.raises(ConfigError) as info:
        check_env(cfg, ROW)
    said = str(info.value)
    assert said.startswith(f"env.name='{tmp_path / 'env.py'}:factory': its step, tried on a first turn whose text is")
    assert "not an EnvStep: every episode would end there; return an EnvStep" in said


def test_an_environment_whose_step_raises_on_the_stand_in_turn_goes_on(tmp_path):
    """A step that raises on a made-up turn may not on the model's: left to the episodes to count."""
    from rlpost.controller.setup import check_env

    (tmp_path / "env.py").write_text(
        "class E:\n    tools = []\n\n    def step(self, turn):\n        raise ValueError(turn.text)\n\n\n"
        "def factory(row, options):\n    return E()\n"
    )
    cfg = load_config(["+recipe=quickstart", f"env.name={tmp_path / 'env.py'}:factory"], this_machine=False)
    assert check_env(cfg, ROW) is not None


def test_rlposts_own_scorer_that_cannot_score_the_rows_stops_the_run_before_the_actors():
    """t137: `reward.fn=reasoning_gym` on the quickstart's arithmetic rows failed on every sample ("'int'
    object is not subscriptable"), only warned at the first try, and trained on zeros."""
    cfg = load_config(["+recipe=quickstart", "reward.fn=reasoning_gym"], this_machine=False)
    with pytest.raises(ConfigError) as info:
        check_reward_values(cfg, [PromptRow([1], "13+21=", "034", "arithmetic")])
    assert str(info.value).startswith(
        "reward.fn=reasoning_gym cannot score the first training row (its ground truth '034' as the response): "
        "ValueError: ground truth '034' is not a reasoning-gym entry (JSON with its 'dataset')"
    )
    check_reward_values(load_config(["+recipe=quickstart", "reward.fn=arithmetic"], this_machine=False), [ROW])


def test_a_new_key_of_a_mapping_without_its_plus_is_told_the_plus():
    """t133: `reward.kwargs.method=flexible` was "unknown config key ... did you mean: reward.kwargs?"."""
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", "reward.fn=gsm8k", "reward.kwargs.method=flexible"], this_machine=False)
    assert str(info.value) == (
        "unknown config key 'reward.kwargs.method': reward.kwargs is a mapping, whose new keys are added with +: "
        "+reward.kwargs.method=VALUE"
    )
    cfg = load_config(["+recipe=quickstart", "reward.fn=gsm8k", "+reward.kwargs.method=flexible"], this_machine=False)
    assert cfg.reward.kwargs == {"method": "flexible"}


def test_more_reward_processes_than_cores_are_said():
    """t157: `reward.num_workers=64` on 2 cores: step 1 took 93 s, said only as "still running" lines."""
    from rlpost.controller.alerts import worker_count_warning

    mine = ["+recipe=quickstart", "reward.fn=/x/r.py:score"]
    cfg = load_config([*mine, "reward.num_workers=64"], this_machine=False)
    assert worker_count_warning(cfg, cores=2) == (
        "warning: reward.num_workers=64 on a machine of 2 CPU cores: 64 processes each run /x/r.py:score's file and "
        "share the cores; reward.num_workers=2 or fewer is faster"
    )
    assert worker_count_warning(cfg, cores=64) is None
    assert worker_count_warning(load_config([*mine, "reward.num_workers=2"], this_machine=False), cores=2) is None
    builtin = load_config(["+recipe=quickstart", "reward.num_workers=64"], this_machine=False)
    assert worker_count_warning(builtin, cores=2) is None  # rlpost's own scorers run in the controller


def test_a_refusal_names_what_the_folder_holds_and_offers_no_resume_without_a_checkpoint(tmp_path):
    """t152: a folder of a run without checkpoints was said to hold "metrics.jsonl, checkpoints/" and
    told to resume with trainer.resume=auto, which would find nothing to resume."""
    from rlpost.controller.run_dir import another_run

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    said = another_run(tmp_path, "/o/checkpoints/step_4", tmp_path.parent / "o", fresh=False)
    assert said.startswith(f"run.dir={str(tmp_path)!r} holds another run's steps (metrics.jsonl), and trainer.resume=")
    assert "resume it with" not in said and said.endswith(
        "and no complete checkpoint to go on from: choose another run.dir, or set run.overwrite=true to delete that "
        "run's logs and start again"
    )


def test_deleting_a_whole_section_is_refused():
    """t131: `~trainer` reset every trainer key to the schema's default, `trainer.total_steps=2` given on
    the same command line too, without a word."""
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", "~trainer", "trainer.total_steps=2"], this_machine=False)
    assert str(info.value).startswith("'~trainer': a whole section cannot be deleted (its keys, the recipe's and this")


def test_a_training_file_whose_rows_are_all_in_another_is_named(tmp_path):
    """t148: a byte-identical copy of a training file (or a part of an "all" file listed beside it)
    trained every row twice without a word; rows sharing only some lines are no copy."""
    import json

    from rlpost.data.dataset import load_prompts
    from rlpost.data.row_warnings import copy_warning
    from rlpost.tiny.model import build_char_tokenizer

    def write(name, sums):
        path = tmp_path / name
        path.write_text(
            "".join(json.dumps({"prompt": f"{a}+{b}=", "ground_truth": str(a + b)}) + "\n" for a, b in sums)
        )
        return str(path)

    rows = [(1, 2), (3, 4), (5, 6)]
    train, copy, part, other = (
        write("t.jsonl", rows),
        write("c.jsonl", rows),
        write("p.jsonl", rows[1:]),
        write("o.jsonl", [(3, 4), (7, 8)]),
    )
    tok = build_char_tokenizer()

    def warning(*sources):
        loaded = load_prompts(list(sources), tok, 64)
        return copy_warning(loaded.rows, loaded.files)

    said = "is in {} too, so those rows are trained on at least twice as often as the rest: list one of the two files"
    assert warning(train, copy) == f"warning: every row of {train} (prompt and ground truth) " + said.format(copy)
    assert warning(part, other, train) == f"warning: every row of {part} (prompt and ground truth) " + said.format(
        train
    )
    assert warning(train, other) is None and warning(train) is None
    answers = write("a.jsonl", [(1, 2), (3, 5)])  # the same prompts, other answers: conflict_warning's, not a copy
    assert warning(answers, train) is None


def test_chat_rows_for_the_tiny_model_are_said():
    """t144: chat-message rows given to the tiny model (warmed up on `13+21=`) trained on rewards of
    0 with only the generic uniform-rewards warning."""
    from rlpost.controller.alerts import tiny_chat_warning

    cfg = load_config(["+recipe=quickstart"])
    assert tiny_chat_warning(cfg, 80) == (
        "warning: 80 prompts are chat messages, and model.path=tiny was warmed up on plain prompts (13+21=) only: it "
        "reads them through a chat template it never saw, so expect rewards near 0; give string prompts, or a chat "
        "model (model.path=smollm2-135m-instruct)"
    )
    assert tiny_chat_warning(cfg, 0) is None
    assert tiny_chat_warning(load_config(["+recipe=quickstart", "model.path=org/m"], this_machine=False), 80) is None


def test_the_start_says_a_copied_file_and_chat_rows_for_the_tiny_model(tmp_path):
    """t144 and t148 through `load_data`, the start's own reading of the files."""
    import json

    from rlpost.controller.setup import load_data
    from rlpost.tiny.model import build_char_tokenizer

    chat = "".join(
        json.dumps({"prompt": [{"role": "user", "content": f"{a}+{a}="}], "ground_truth": str(2 * a)}) + "\n"
        for a in range(1, 9)
    )
    for name in ("t.jsonl", "c.jsonl"):
        (tmp_path / name).write_text(chat)
    (tmp_path / "v.jsonl").write_text(json.dumps({"prompt": "9+9=", "ground_truth": "18"}) + "\n")
    train, copy, val = (str(tmp_path / n) for n in ("t.jsonl", "c.jsonl", "v.jsonl"))
    cfg = load_config(
        ["+recipe=quickstart", "data.task=", f"data.train_files=[{train},{copy}]", f"data.val_files=[{val}]"]
        + ["data.train_batch_size=4", "data.max_prompt_length=64", "reward.fn=arithmetic"]
    )
    said: list[str] = []
    load_data(cfg, build_char_tokenizer(), log=said.append)
    assert f"warning: every row of {train} (prompt and ground truth) is in {copy} too" in "\n".join(said)
    assert "warning: 16 prompts are chat messages, and model.path=tiny was warmed up" in "\n".join(said)
