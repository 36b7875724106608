"""The fourth catalogue of bad inputs (issue 39), its model-folder and checkpoint cases: a model
folder that is empty, a file, or holds a config.json that is not JSON, names a model_type
transformers does not know, or does not fit its weights; a tokenizer without an eos token; the
tiny model's heads, positions and shape on resume; an export whose base model moved. Each is now
refused before any actor starts (most in the config's rules), naming the key or file and what to
do. The rules' own violations are walked in tests/config/test_config.py too."""

from __future__ import annotations

import json

import pytest
import torch

from rlpost.cli import main
from rlpost.config import ConfigError, compose, load_config, to_yaml
from rlpost.controller.run_dir import claim_run_dir
from rlpost.controller.setup import load_data
from rlpost.models.loading import load_tokenizer
from tests.helpers import controller_bytes, save_tiny_model

QUICK = ["+recipe=quickstart"]


def model_folder(tmp_path, **shape):
    folder = tmp_path / "m"
    save_tiny_model(folder, **{"hidden": 32, "layers": 1, "intermediate": 64, **shape})
    return folder


def edit_json(file, **changes):
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))


def test_a_config_json_that_is_not_json_is_named_in_train_and_plan(tmp_path, capsys):  # c22, c55
    m = model_folder(tmp_path)
    (m / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 128,\n')
    capsys.readouterr()  # (the save's progress bar)
    says = (
        f"model.path='{m}': {m / 'config.json'} is not valid JSON (Expecting property name enclosed in double quotes: "
        "line 2 column 1 (char 44)): repair it, or copy the model's config.json again"
    )
    with pytest.raises(ConfigError) as info:
        load_config([*QUICK, f"model.path={m}"])
    assert str(info.value) == says
    assert main(["plan", *QUICK, f"model.path={m}"]) == 2
    assert capsys.readouterr().err == f"rlpost plan: {says}\n"


def test_an_empty_folder_as_model_path_says_what_a_model_folder_holds(tmp_path):  # c23
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"^model.path='.*/empty': no config.json in this folder \(it is empty\), "
                       r"not a Hugging Face model: a model folder holds config.json, the weights"):  # fmt: skip
        load_config([*QUICK, f"model.path={tmp_path / 'empty'}"])
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"no config.json in this folder \(it holds notes.txt\)"):
        load_config([*QUICK, f"model.path={tmp_path / 'empty'}"])


def test_the_weights_file_as_model_path_asks_for_its_folder(tmp_path):  # c26
    m = model_folder(tmp_path)
    with pytest.raises(ConfigError, match=rf"^model.path='{m}/model.safetensors' is a file: give the folder that "
                       rf"holds it \({m}\); a model folder holds config.json"):  # fmt: skip
        load_config([*QUICK, f"model.path={m / 'model.safetensors'}"])


def test_a_model_type_transformers_does_not_know_is_refused_in_the_config(tmp_path):  # c24
    m = model_folder(tmp_path)
    edit_json(m / "config.json", model_type="qwen9")
    says = rf"^model.path='{m}': {m}/config.json has model_type='qwen9', which transformers [0-9.]+ does not know: "
    with pytest.raises(ConfigError, match=says + r"correct model_type \(the model's family, e.g. qwen2 or llama\)"):
        load_config([*QUICK, f"model.path={m}"])
    load_config([*QUICK, f"model.path={m}"], this_machine=False)  # `rlpost plan` reads the shape only


def test_weights_that_do_not_fit_config_json_are_refused_before_the_actors(tmp_path):  # c64
    m = model_folder(tmp_path, hidden=64)
    edit_json(m / "config.json", hidden_size=32)
    cfg = load_config([*QUICK, f"model.path={m}", f"model.cache_dir={tmp_path / 'cache'}"])
    vocab = len(load_tokenizer(str(m)))
    with pytest.raises(ConfigError) as info:
        load_data(cfg, load_tokenizer(str(m)), lambda *_: None, str(m))
    assert str(info.value) == (
        f"model.path='{m}': the weights in {m} do not fit its config.json: model.embed_tokens.weight is "
        f"[{vocab}, 64] in model.safetensors, but config.json makes it [{vocab}, 32]: give the config.json these "
        "weights were saved with (or the weights of this config)"
    )


def test_a_tokenizer_without_an_eos_token_is_refused_before_the_actors(tmp_path):  # c65
    m = model_folder(tmp_path)
    edit_json(m / "tokenizer_config.json", eos_token=None)
    for name in ("config.json", "generation_config.json"):
        edit_json(m / name, eos_token_id=None)
    cfg = load_config([*QUICK, f"model.path={m}", f"model.cache_dir={tmp_path / 'cache'}"])
    says = rf"^model.path='{m}': the tokenizer in {m} has no eos_token \(the token that ends a response\): "
    with pytest.raises(ConfigError, match=says + rf"set eos_token in {m}/tokenizer_config.json to the model's end"):
        load_data(cfg, load_tokenizer(str(m)), lambda *_: None, str(m))


def test_tiny_heads_that_do_not_divide_are_refused_naming_both_keys():  # c43
    with pytest.raises(ConfigError, match=r"^model.tiny.num_kv_heads=2 does not divide model.tiny.num_heads=3 "
                       r"\(.*\): change one of them, e.g. model.tiny.num_heads=4$"):  # fmt: skip
        load_config([*QUICK, "model.tiny.num_heads=3"])
    load_config([*QUICK, "model.tiny.num_heads=6", "model.tiny.hidden_size=192"])


def test_tiny_positions_below_the_lengths_are_refused_before_the_build():  # c44
    with pytest.raises(ConfigError, match=r"^data.max_prompt_length=16 \+ rollout.max_response_length=4 = 20 tokens, "
                       r"more than model.tiny.max_position=8: set model.tiny.max_position=20 or more"):  # fmt: skip
        load_config([*QUICK, "model.tiny.max_position=8"])
    load_config([*QUICK, "model.tiny.max_position=20"])


def test_resuming_with_another_tiny_shape_names_the_model_tiny_keys(tmp_path):  # c49
    run = tmp_path / "run"
    step = run / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    (step / "controller.pt").write_bytes(controller_bytes())
    (step / "manifest.json").write_text(json.dumps({"controller.pt": len(controller_bytes())}))
    (run / "config.yaml").write_text(to_yaml(load_config([*QUICK, f"run.dir={run}"])))
    now = ["model.tiny.hidden_size=64", "model.tiny.intermediate_size=192", "trainer.total_steps=4"]
    cfg = load_config([*QUICK, f"run.dir={tmp_path / 'new'}", f"trainer.resume={step}", *now])
    says = r"saved by a run with other settings: model.tiny.hidden_size=128 there, 64 here; "
    with pytest.raises(ConfigError, match=says + r"model.tiny.intermediate_size=384 there, 192 here\. Resume with"):
        claim_run_dir(cfg, log=lambda *_: None)
    same = load_config([*QUICK, f"run.dir={tmp_path / 'new'}", f"trainer.resume={step}", "trainer.total_steps=4"])
    claim_run_dir(same, log=lambda *_: None)


def finished_run(tmp_path, model_path: str, trainer: bool = False):
    """A run folder with config.yaml and a complete checkpoint at step 2 (`trainer`: with a trainer/
    folder, whose weights the export would load into the base model)."""
    run = tmp_path / "run"
    step = run / "checkpoints" / "step_2"
    (step / "trainer" if trainer else step).mkdir(parents=True)
    if trainer:
        (step / "trainer" / ".metadata").write_bytes(b"")
    torch.save({"step": 2}, step / "controller.pt")
    (step / "manifest.json").write_text(json.dumps({"controller.pt": (step / "controller.pt").stat().st_size}))
    (run / "config.yaml").write_text(to_yaml(compose([*QUICK, f"model.path={model_path}", f"run.dir={run}"])))
    return run


def test_export_of_a_run_whose_model_moved_names_it_and_leaves_no_folder(tmp_path, capsys):  # c31
    run, out = finished_run(tmp_path, str(tmp_path / "gone"), trainer=True), tmp_path / "exp"
    assert main(["export", str(run), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"rlpost export: model.path='{tmp_path / 'gone'}' (the run's, in {run / 'config.yaml'}): no such folder any "
        "more; the export reads the base model's config and tokenizer from it: move the model back there, or set "
        f"model.path in {run / 'config.yaml'} to its new place\n"
    )
    assert not out.exists()


def test_a_failed_export_leaves_no_folder_it_made(tmp_path, capsys):  # c31: the empty --out left behind
    run = finished_run(tmp_path, str(model_folder(tmp_path)))  # no trainer/ in the checkpoint: fails after --out
    out, given = tmp_path / "a" / "exp", tmp_path / "given"
    capsys.readouterr()  # (the save's progress bar)
    assert main(["export", str(run), "--out", str(out)]) == 2
    assert "trainer/.metadata not found" in capsys.readouterr().err and not out.exists()
    given.mkdir()  # an empty folder of the user's: kept, still empty
    assert main(["export", str(run), "--out", str(given)]) == 2
    assert given.is_dir() and not any(given.iterdir())
