"""The third catalogue of bad inputs (issue 39 item 5: 57 tried by a tester who did not write the code,
12 not yet handled): each is now refused early naming the key, file or row, or said before the first
step. The damaged checkpoint `rlpost export` took is in tests/controller/test_checkpoint.py; the rules
(a W&B key for online mode, a KL target that acts) in tests/config/test_config.py's walk of them."""

from __future__ import annotations

import pytest

from rlpost.cli import main
from rlpost.config import ConfigError, load_config
from rlpost.controller.alerts import no_signal, setting_warnings
from rlpost.controller.reward_checks import check_builtin_kwargs
from rlpost.controller.setup import check_lora_targets
from rlpost.data.dataset import DataError, check_row
from rlpost.data.tasks import arithmetic_pairs
from tests.helpers import save_tiny_model

QUICK = ["+recipe=quickstart"]


def test_rlpost_data_replaces_no_file_it_did_not_write(tmp_path, capsys):
    mine = tmp_path / "train.jsonl"
    mine.write_text('{"prompt": "mine", "ground_truth": "1"}\n')
    assert main(["data", "arithmetic", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"rlpost data: {mine} exists (an earlier rlpost data's, or yours); rlpost data writes train.jsonl and "
        "val.jsonl into the folder --out and replaces no file: choose another --out, or move those files away\n"
    )
    assert mine.read_text() == '{"prompt": "mine", "ground_truth": "1"}\n' and not (tmp_path / "val.jsonl").exists()
    assert main(["data", "arithmetic", "--out", str(mine)]) == 2  # a file as --out: named, not a traceback
    assert capsys.readouterr().err.startswith(f"rlpost data: {mine} exists (")


def test_more_digits_than_every_pair_can_list_are_refused_at_once(capsys):
    with pytest.raises(DataError, match=r"^data.arithmetic_digits=9: .* every pair of 9-digit numbers as a problem "
                       r"\(8.1e\+17 of them\); give at most 3 digits \(810000 problems\)"):  # fmt: skip
        arithmetic_pairs(9, seed=0)
    assert len(arithmetic_pairs(1, seed=0)) == 100  # 0..9 twice: the small cases unchanged
    assert main(["data", "arithmetic", "--out", "/tmp/unused_by_this_test", "data.arithmetic_digits=5"]) == 2
    assert "data.arithmetic_digits=5" in capsys.readouterr().err


@pytest.mark.parametrize(
    "prompt, says",
    [
        ([], "field 'prompt' is an empty list of chat messages"),
        ([{"role": "wizard", "content": "1+1="}], "field 'prompt' message 0 has role 'wizard', not one of ("),
        (
            [{"role": "user", "content": "a"}, {"role": "usr", "content": "b"}],
            "field 'prompt' message 1 has role 'usr'",
        ),
        (None, "field 'prompt' is null"),
    ],
)
def test_chat_prompts_a_template_cannot_render_as_meant_name_the_row(prompt, says):
    with pytest.raises(DataError, match=rf"^rows.jsonl: row 4: {says}".replace("(", r"\(")):
        check_row({"prompt": prompt, "ground_truth": "2"}, "rows.jsonl: row 4")
    roles = [{"role": r, "content": "x"} for r in ("system", "user", "assistant", "tool")]
    assert check_row({"prompt": roles, "ground_truth": "2"}, "r")["prompt"] == roles


def test_lora_targets_the_model_lacks_are_refused_before_the_actors_naming_its_layers(tmp_path):
    save_tiny_model(tmp_path / "m")
    cfg = load_config([*QUICK, "model.lora.rank=8", "model.lora.target_modules=[q_proj,qproj]"], this_machine=False)
    with pytest.raises(ConfigError) as info:
        check_lora_targets(cfg, str(tmp_path / "m"))
    message = str(info.value)
    assert message.startswith("model.lora.target_modules=['q_proj', 'qproj']: ['qproj'] names no layer of ")
    assert "'q_proj'" in message.split("its layers are ")[1] and message.endswith("(or [all-linear])")
    for targets in ("[q_proj,v_proj]", "[all-linear]", "[self_attn.q_proj]"):  # a name, all, or its last parts
        ok = load_config([*QUICK, "model.lora.rank=8", f"model.lora.target_modules={targets}"], this_machine=False)
        check_lora_targets(ok, str(tmp_path / "m"))


def test_reward_kwargs_a_built_in_does_not_take_are_refused_before_the_actors():
    with pytest.raises(
        ConfigError, match=r"^reward.kwargs=\{'scale': 2\}: reward.fn=arithmetic takes \(sample.* \(got an unexpected"
    ):
        check_builtin_kwargs("arithmetic", {"scale": 2})
    with pytest.raises(ConfigError, match=r"^reward.kwargs=\{'scale': 2\} go to an explicitly named reward.fn, "):
        check_builtin_kwargs("auto", {"scale": 2})
    check_builtin_kwargs("gsm8k", {"method": "flexible"})  # one it takes
    check_builtin_kwargs("auto", {})
    check_builtin_kwargs("my.py:score", {"scale": 2})  # the user's function: tried on a first row instead


def test_settings_that_train_but_not_as_their_values_say_are_said_before_the_first_step():
    assert setting_warnings(load_config(QUICK, this_machine=False)) == []
    cfg = load_config([*QUICK, "trainer.total_steps=2", "trainer.optim.warmup_steps=500"], this_machine=False)
    steps = 2  # the quickstart: 1 epoch of 1 mini-batch (the whole batch) a step
    assert (cfg.algo.ppo_epochs, cfg.algo.ppo_mini_batch_size) == (1, 0)
    [warmup] = setting_warnings(cfg)
    assert warmup.startswith(f"warning: trainer.optim.warmup_steps=500 is not below the run's {steps} optimizer ")
    edge = load_config([*QUICK, "trainer.total_steps=2", f"trainer.optim.warmup_steps={steps - 1}"], this_machine=False)
    assert setting_warnings(edge) == []
    epochs = load_config(
        [*QUICK, "trainer.total_steps=2", "algo.ppo_epochs=4", "trainer.optim.warmup_steps=7"], this_machine=False
    )
    assert (
        setting_warnings(epochs) == []
    )  # 8 optimizer steps: 4 epochs a step  # one step past the warm-up: the learning rate is reached
    small = load_config([*QUICK, "trainer.max_tokens_per_microbatch=3"], this_machine=False)
    longest = small.data.max_prompt_length + small.rollout.max_response_length
    assert setting_warnings(small) == [
        f"warning: trainer.max_tokens_per_microbatch=3 is below one sequence's {longest} tokens (data.max_prompt_length"
        " + rollout.max_response_length): a longer sequence goes alone in its micro-batch (slow where the budget is "
        "far below it)"
    ]


def test_skipped_optimizer_steps_are_said_by_role():
    cfg = load_config(QUICK, this_machine=False)
    found = no_signal(cfg, 3, {"critic/skipped_steps": 8.0, "actor/skipped_steps": 0.0, "reward/mean": 0.5})
    assert list(found) == ["skipped_critic"]
    assert found["skipped_critic"].startswith("warning: in step 3 8 optimizer steps of the critic were skipped ")


def test_plan_refuses_an_option_it_does_not_have(capsys):
    assert main(["plan", "+recipe=quickstart", "--gpu", "80"]) == 2
    assert capsys.readouterr().err == "rlpost plan: unknown option --gpu (the one option is --gpu-gb N, given once)\n"
    assert main(["plan", "+recipe=quickstart", "--gpu-gb", "80", "--gpu-gb", "40"]) == 2
    assert capsys.readouterr().err.startswith("rlpost plan: --gpu-gb given twice (the one option")


@pytest.mark.parametrize(
    "override, hint",
    [
        ("recipe=quickstart", "unknown config key 'recipe'; a recipe is chosen with +recipe=NAME (the + adds it)"),
        ("logger.backends=console", "(a list is written in brackets: KEY=[a,b])"),
    ],
)
def test_two_common_slips_on_the_command_line_get_the_way_to_write_them(override, hint, capsys):
    extra = [] if override.startswith("recipe") else QUICK
    assert main(["train", *extra, override]) == 2
    assert hint in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["model.lora.rank=8", "model.lora.target_modules=[qproj]"], "model.lora.target_modules=['qproj']: "),
        (["reward.fn=arithmetic", "+reward.kwargs.scale=2"], "reward.kwargs={'scale': 2}: reward.fn=arithmetic"),
        (["trainer.optim.warmup_steps=500", "trainer.total_steps=2"], "warning: trainer.optim.warmup_steps=500 "),
    ],
)
def test_the_controller_runs_these_checks_before_any_actor_starts(tmp_path, overrides, says):
    """`load_data` is what the controller calls before it starts the actors (controller/loop.py)."""
    from rlpost.controller.setup import load_data
    from rlpost.tiny.model import build_char_tokenizer

    save_tiny_model(tmp_path / "m")
    cfg = load_config([*QUICK, "data.arithmetic_digits=1", "data.val_size=20", *overrides], this_machine=False)
    said = []
    try:
        load_data(cfg, build_char_tokenizer(), log=said.append, model_path=str(tmp_path / "m"))
    except ConfigError as e:
        said.append(str(e))
    assert any(line.startswith(says) for line in said), said


def test_wandb_that_cannot_start_is_one_line_naming_the_mode(tmp_path, monkeypatch):
    """#51: online with a key and no network; wandb gave up after about 100 s in a traceback."""
    import sys
    from types import SimpleNamespace

    from rlpost.metrics.trackers import TrackerError, WandbTracker

    def no_network(**_):
        raise TimeoutError("Timed out while retrying")

    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(init=no_network))
    with pytest.raises(TrackerError) as info:
        WandbTracker(tmp_path, "rlpost", "online", {})
    assert str(info.value) == (
        "logger.wandb_mode=online: wandb could not start (TimeoutError: Timed out while retrying); run `wandb login` "
        "and check the network, or set logger.wandb_mode=offline (sync later with `wandb sync`)"
    )


@pytest.mark.parametrize("tied", [True, False])
def test_lora_on_a_layer_tied_to_the_embeddings_is_refused_before_the_actors(tmp_path, tied):
    """The eighth catalogue's e03: LoRA on `embed_tokens` of a tied model was refused only by the
    trainer actors, after Ray started, as a 69-line traceback."""
    save_tiny_model(tmp_path / "m", tied=tied)
    for target in ("embed_tokens", "lm_head"):
        cfg = load_config([*QUICK, "model.lora.rank=8", f"model.lora.target_modules=[{target}]"], this_machine=False)
        if tied:
            with pytest.raises(ConfigError, match=rf"LoRA on \['{target}'\], whose weight is the input embeddings'"):
                check_lora_targets(cfg, str(tmp_path / "m"))
        elif target == "lm_head":  # untied: the head is a layer of its own
            check_lora_targets(cfg, str(tmp_path / "m"))
