"""The sixth catalogue of bad inputs (issue 39), tried by someone who did not write the code: the
five that ended in a traceback. Each is now a clear error naming what is at fault."""

from __future__ import annotations

import json

import pytest

from rlpost.config import ConfigError
from rlpost.controller.ray_checks import check_ray_can_start
from rlpost.data.dataset import DataError, load_prompts
from rlpost.models.loading import ModelFileError, load_tokenizer
from tests.helpers import save_tiny_model


def test_a_prompt_with_a_lone_surrogate_names_its_row(tmp_path):  # d07
    from rlpost.tiny.model import build_char_tokenizer

    path = tmp_path / "surrogate.jsonl"
    path.write_text('{"prompt": "1+1=", "ground_truth": "2"}\n{"prompt": "12+\\ud800=", "ground_truth": "000"}\n')
    with pytest.raises(DataError) as info:
        load_prompts([str(path)], build_char_tokenizer(), 64)
    assert str(info.value).startswith(f"{path}: row 1: the prompt holds text the tokenizer cannot take (")
    assert str(info.value).endswith("e.g. a lone UTF-16 surrogate written as \\ud800: fix the row")


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_tokenizer_file_cut_short_is_named(tmp_path, name):  # m01
    save_tiny_model(tmp_path, hidden=32, layers=2, intermediate=64)
    text = (tmp_path / name).read_text()
    (tmp_path / name).write_text(text[: len(text) // 2])
    with pytest.raises(ModelFileError) as info:
        load_tokenizer(str(tmp_path))
    assert str(info.value).startswith(f"the tokenizer files in {tmp_path} cannot be read (")
    assert str(info.value).endswith("is damaged or cut short; copy the model's files again")


def test_a_chat_template_that_fails_names_the_row_and_the_template(tmp_path):  # m03b
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_folder_with_tokenizer(tmp_path))
    tok.chat_template = "{% for m in messages %}{{ m.content }{% endfor %}"  # one brace short
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "ground_truth": "2"}) + "\n")
    with pytest.raises(DataError) as info:
        load_prompts([str(path)], tok, 64)
    assert str(info.value).startswith(f"{path}: row 0: the model's chat template fails on this prompt (")
    assert "fix the template (chat_template.jinja or tokenizer_config.json's chat_template in " in str(info.value)


def _folder_with_tokenizer(tmp_path):
    folder = tmp_path / "model"
    save_tiny_model(folder, hidden=32, layers=2, intermediate=64)
    return str(folder)


def test_a_home_ray_cannot_write_into_is_refused_before_ray_starts(monkeypatch):  # e02
    monkeypatch.setenv("HOME", "/dev/null")
    with pytest.raises(ConfigError, match=r"^HOME='/dev/null' is not a folder this user can write: Ray writes ~/.ray"):
        check_ray_can_start()


@pytest.mark.parametrize("value, refused", [("error", True), ("ignore,error", True), ("error::", True),
                                            ("error::DeprecationWarning", False), ("default", False)])  # fmt: skip
def test_warnings_made_errors_everywhere_are_refused_before_ray_starts(monkeypatch, tmp_path, value, refused):  # e03
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PYTHONWARNINGS", value)
    if refused:
        with pytest.raises(ConfigError, match=r"makes every warning an error, also in Ray's own processes"):
            check_ray_can_start()
    else:
        check_ray_can_start()


def test_a_reward_that_ends_its_process_on_the_first_try_stops_the_run(tmp_path):  # r04
    from rlpost.config import load_config
    from rlpost.controller.reward_checks import check_reward_values
    from rlpost.data.dataset import PromptRow

    (tmp_path / "r_exit.py").write_text("import os\ndef score(sample):\n    os._exit(3)\n")
    cfg = load_config(["+recipe=quickstart", f"reward.fn={tmp_path}/r_exit.py:score"])
    with pytest.raises(ConfigError) as info:
        check_reward_values(cfg, [PromptRow([1], "2+2=", "4", "arithmetic")])
    assert "on a first try" in str(info.value) and "the reward worker died (exit code 3)" in str(info.value)
    assert str(info.value).endswith("The function ended its process; it must return a number")


def test_a_pipe_named_as_a_data_file_is_not_called_missing(tmp_path):  # d06
    import os

    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(DataError, match=r"fifo.jsonl: not a regular file \(a pipe or a device\): save the rows"):
        load_prompts([str(tmp_path / "fifo.jsonl")], None, 64)


@pytest.mark.parametrize("odd", ["checkpoints", "metrics.jsonl"])
def test_a_run_file_of_the_wrong_kind_is_refused_when_the_folder_is_claimed(tmp_path, odd):  # f04
    from rlpost.config import load_config
    from rlpost.controller.run_dir import claim_run_dir

    (tmp_path / odd).write_text("mine") if odd == "checkpoints" else (tmp_path / odd).mkdir()
    with pytest.raises(ConfigError, match=rf"holds {odd} of another kind than a run writes there"):
        claim_run_dir(load_config(["+recipe=quickstart", f"run.dir={tmp_path}"]), log=lambda *_: None)
    assert not (tmp_path / "config.yaml").exists()


@pytest.mark.parametrize("rows", ["", '{"step": 0, "rollout/gpu_used_gb": 10.0}\n'])
def test_plotting_a_run_without_a_trained_step_is_refused_by_name(tmp_path, rows, capsys):  # p07
    from rlpost.cli import main

    (tmp_path / "metrics.jsonl").write_text(rows)
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "c.png")]) == 2
    assert f"{tmp_path / 'metrics.jsonl'} has no trained step yet: nothing to plot" in capsys.readouterr().err
    assert not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("steps", [["--step", "2", "--step", "3"], ["--step=2", "--step", "2"]])
def test_export_refuses_a_step_given_twice(tmp_path, steps, capsys):  # p08
    from rlpost.cli import main

    with pytest.raises(SystemExit) as info:
        main(["export", str(tmp_path), *steps, "--out", str(tmp_path / "out")])
    assert info.value.code == 2 and "--step given more than once" in capsys.readouterr().err


def test_a_sigterm_while_ray_starts_is_a_stop_said_as_one(monkeypatch, capsys):  # k02
    """Ray's `ray.init` puts in its own SIGTERM handler (`sys.exit(15)`) while it starts: a SIGTERM
    then ended the run with exit code 15 and no word. It is a stop on SIGTERM (exit code 143), said,
    with what Ray had started shut down; any other exit goes on as it was."""
    import os
    import signal
    import sys

    import ray

    from rlpost.controller import cluster
    from rlpost.controller.signals import Stopped

    def init_then_sigterm(**kwargs):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # as ray.init does
        os.kill(os.getpid(), signal.SIGTERM)

    shut = []
    monkeypatch.setattr(ray, "init", init_then_sigterm)
    monkeypatch.setattr(ray, "shutdown", lambda: shut.append(True))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(Stopped) as info:
            cluster.init_ray(address="local")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert info.value.exit_code == 143 and shut == [True]
    assert "SIGTERM while Ray was starting: stopping now" in capsys.readouterr().err
    monkeypatch.setattr(ray, "init", lambda **kwargs: sys.exit(3))
    with pytest.raises(SystemExit) as other:
        cluster.init_ray(address="local")
    assert other.value.code == 3


def test_a_hub_id_without_a_network_or_a_cache_is_said_at_once(monkeypatch):  # m02
    """Without a network transformers retried a hub id for about a minute, then spoke of a missing
    tokenizer. A hub id not in the Hugging Face cache, with the hub unreachable, is refused at once;
    one in the cache goes on without a probe, and with HF_HUB_OFFLINE=1 none is made."""
    import socket
    import time

    import huggingface_hub
    from huggingface_hub import constants

    from rlpost.models.loading import resolve_path

    probes = []

    def unreachable(address, timeout=None):
        probes.append(address)
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: None)
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"^the model 'org/model' is not a local folder nor in the Hugging "):
        resolve_path("org/model", "/tmp/unused")
    assert time.monotonic() - start < 2 and probes == [("huggingface.co", 443)]
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: "/cache/config.json")
    assert resolve_path("org/model", "/tmp/unused") == "org/model" and len(probes) == 1  # cached: no probe
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: None)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # offline: the cache only, no probe (and, not
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE=1 is set, so the hub is not asked"):  # cached,
        resolve_path("org/model", "/tmp/unused")  # said as such: the sixteenth catalogue's t101)
    assert len(probes) == 1
