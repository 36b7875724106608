"""Paths and command-line arguments as users give them (the second catalogue of bad inputs, issue
39): a model folder without weights, chat prompts for a tokenizer without a chat template, a hub
id that cannot be reached, a run folder or an export under a file, `rlpost plan --gpu-gb` spelled
`--gpu-gb=N` or given a size of 0 or less. Each is named in one line before anything starts."""

from __future__ import annotations

import json

import pytest

from rlpost.cli import main
from rlpost.config import ConfigError, load_config
from rlpost.controller.run_dir import claim_run_dir
from rlpost.data.dataset import DataError, load_prompts
from rlpost.models.loading import load_tokenizer
from rlpost.tiny.model import build_char_tokenizer
from tests.helpers import controller_bytes


def test_a_model_folder_without_weights_is_refused_at_start(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"model.path='.*model' holds config.json but no weights"):
        load_config(["+recipe=quickstart", f"model.path={folder}"])
    load_config(["+recipe=quickstart", f"model.path={folder}"], this_machine=False)  # `rlpost plan` reads it
    (folder / "model.safetensors").write_bytes(b"")
    load_config(["+recipe=quickstart", f"model.path={folder}"])


def test_chat_prompts_need_a_chat_template_and_the_row_and_file_are_named(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+2="}], "ground_truth": "3"}) + "\n")
    tok = build_char_tokenizer()
    tok.chat_template = None
    with pytest.raises(DataError, match=r"chat.jsonl: row 0: the prompt is chat messages, but the model's tokenizer"):
        load_prompts([str(path)], tok, 64)


def test_a_model_without_a_tokenizer_to_load_is_named_in_one_line(monkeypatch):
    import transformers

    def offline(path, **kwargs):  # what transformers raises for a hub id without the network
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load the files.\nCheck {path}")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(FileNotFoundError) as info:
        load_tokenizer("org/model")
    assert str(info.value) == (
        "the model 'org/model' has no tokenizer to load (We couldn't connect to 'https://huggingface.co' to load the "
        "files.): give a local folder with the model's files (or, for a hub id, a network or HF_HUB_OFFLINE=1 with "
        "a filled cache)"
    )


def test_a_run_folder_under_a_file_is_named(tmp_path):
    (tmp_path / "a_file").write_text("x")
    cfg = load_config(["+recipe=quickstart", f"run.dir={tmp_path / 'a_file' / 'run'}"])
    with pytest.raises(ConfigError, match=r"run.dir='.*a_file/run': cannot write there \(Not a directory\)"):
        claim_run_dir(cfg, log=lambda *_: None)


def test_an_export_under_a_file_or_onto_a_file_is_refused_before_loading(tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    run = tmp_path / "run"
    step = run / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    (step / "controller.pt").write_bytes(controller_bytes())
    (step / "manifest.json").write_text(json.dumps({"controller.pt": len(controller_bytes())}))
    (run / "config.yaml").write_text("{}\n")
    assert main(["export", str(run), "--out", str(tmp_path / "a_file" / "hf")]) == 2
    assert "hf: cannot make the folder (Not a directory)" in capsys.readouterr().err
    assert main(["export", str(run), "--out", str(tmp_path / "a_file")]) == 2
    assert "a_file exists and is not an empty folder" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--gpu-gb", "-5"], ["--gpu-gb=0"], ["--gpu-gb", "lots"], ["--gpu-gb"]])
def test_plan_refuses_a_gpu_size_that_is_no_size(args, capsys):
    assert main(["plan", "+recipe=quickstart", *args]) == 2
    assert capsys.readouterr().err == "rlpost plan: --gpu-gb takes the GPU memory in GiB, above 0 (80 for an H100)\n"


def test_plan_takes_gpu_gb_with_an_equals_sign(capsys):
    assert main(["plan", "+recipe=quickstart", "trainer.device=cuda", "--gpu-gb=80"]) == 0
    assert "memory plan per GPU (80 GiB)" in capsys.readouterr().out


def saved_run(tmp_path, *overrides):
    """A run folder as a run with `overrides` leaves it: config.yaml and a complete checkpoint at step 11."""
    from rlpost.config import to_yaml

    run = tmp_path / "run"
    step = run / "checkpoints" / "step_11"
    step.mkdir(parents=True)
    (step / "controller.pt").write_bytes(controller_bytes())
    (step / "manifest.json").write_text(json.dumps({"controller.pt": len(controller_bytes())}))
    (run / "config.yaml").write_text(to_yaml(load_config(["+recipe=quickstart", f"run.dir={run}", *overrides])))
    return run


@pytest.mark.parametrize(
    "saved, now, says",
    [
        ([], ["trainer.total_steps=5"], r"goes on from .*step_11 \(step 11\), at or past trainer.total_steps=5: "),
        ([], ["trainer.total_steps=11"], r"\(step 11\), at or past trainer.total_steps=11: nothing is left to train"),
        ([], ["algo.name=ppo"], r"algo.name='grpo' there, 'ppo' here \(a critic in one, not the other\)"),
        ([], ["model.lora.rank=8"], r"saved by a run with other settings: model.lora.rank=0 there, 8 here\."),
        (["model.lora.rank=8"], ["model.lora.rank=8", "model.lora.target_modules=[q_proj]"], r"target_modules="),
        # the ninth catalogue's n57-n59: a raw TypeError, or a message about model.path, after the actors started
        ([], ["trainer.optim.offload=layerwise"], r"trainer.optim.offload='none' there, 'layerwise' here \(layerwise"),
        (["trainer.optim.offload=layerwise"], ["trainer.optim.offload=none"], r"offload=.layerwise. there, .none"),
    ],
)
def test_a_resume_that_cannot_go_on_is_refused_before_the_actors_naming_the_keys(tmp_path, saved, now, says):
    run = saved_run(tmp_path, *saved)
    before = (run / "config.yaml").read_text()
    cfg = load_config(["+recipe=quickstart", f"run.dir={run}", "trainer.resume=auto", *saved, *now])
    with pytest.raises(ConfigError, match=says):
        claim_run_dir(cfg, log=lambda *_: None)
    assert (run / "config.yaml").read_text() == before and not (run / "run.lock").exists()  # kept; released
    ok = load_config(["+recipe=quickstart", f"run.dir={run}", "trainer.resume=auto", *saved, "algo.name=dapo"])
    claim_run_dir(ok, log=lambda *_: None)  # another algorithm without a critic, more steps: it goes on


def test_a_stray_ray_address_does_not_take_the_local_start_and_is_said(monkeypatch):
    import ray

    from rlpost.controller import cluster

    started, said = [], []
    monkeypatch.setenv("RAY_ADDRESS", "10.255.255.1:6379")  # left over from another cluster's session
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: started.append(kwargs))
    monkeypatch.setattr(cluster, "workers_at_normal_priority", lambda: None)
    cluster.start_ray(load_config(["+recipe=quickstart"]), said.append)
    assert started[0]["address"] == "local" and started[0]["num_cpus"] >= 2
    assert said == [
        "RAY_ADDRESS=10.255.255.1:6379 is set, cluster.address is not: starting a local Ray (to train on that "
        "cluster, set cluster.address)"
    ]


def test_a_cache_folder_that_cannot_be_written_is_named_before_the_warm_up(tmp_path):
    from rlpost.tiny.build import CacheError, ensure_tiny_model

    (tmp_path / "cache").write_text("a file, not a folder")
    with pytest.raises(ConfigError, match=r"model.cache_dir='.*cache' is a file, not a folder"):  # (cat9's n08)
        load_config(["+recipe=quickstart", f"model.cache_dir={tmp_path / 'cache'}"])
    cfg = load_config(["+recipe=quickstart", f"model.cache_dir={tmp_path / 'cache'}"], this_machine=False)
    with pytest.raises(CacheError, match=r"^model.cache_dir: cannot write into .*cache \(File exists\); set"):
        ensure_tiny_model(cfg.model, cfg.data, log=lambda *_: None)  # it raised after the warm-up, 94 s in


def test_an_unquoted_tilde_says_how_to_quote_it(capsys):
    assert main(["train", "+recipe=quickstart", "run.dir=~/runs/a"]) == 2
    assert (
        capsys.readouterr()
        .err.rstrip()
        .endswith("""(quote a value that holds characters such as ~ = , [ ] or spaces: "run.dir='~/runs/a'")""")
    )


def test_a_run_folder_given_as_the_checkpoint_to_resume_says_which_to_give(tmp_path):
    from rlpost.controller.checkpoint import find

    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"\(no controller.pt\) \(a run folder: trainer.resume=auto with run"):
        find(tmp_path, str(tmp_path), log=lambda *_: None)


def test_an_async_run_resumed_as_a_synchronous_one_is_refused(tmp_path):
    """The eighth catalogue's e52: the batches an async run had drawn ahead are in its checkpoint,
    which only an async run reads: resumed synchronously, 192 prompts were never trained."""
    split = ["cluster.placement=split", "trainer.world_size=1"]
    run = saved_run(tmp_path, *split, "algo.async_rollouts=true", "algo.max_staleness=2")
    sync = load_config(sync_args(run, split))
    with pytest.raises(ConfigError, match=r"algo.async_rollouts=true there, false here \(the prompts it had drawn"):
        claim_run_dir(sync, log=lambda *_: None)
    again = load_config([*sync_args(run, split), "algo.async_rollouts=true", "algo.max_staleness=2"])
    claim_run_dir(again, log=lambda *_: None)  # async again: it goes on


def sync_args(run, split):
    return ["+recipe=quickstart", f"run.dir={run}", "trainer.resume=auto", *split, "trainer.total_steps=20"]
