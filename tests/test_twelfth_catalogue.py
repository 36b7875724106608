"""Faults the twelfth bad-input catalogue found (tried by someone who did not write the code, on
87f04e7): each test fails on the code before its fix."""

import json

import pytest

from rlpost.config import ConfigError
from tests.run_dirs import cfg_in, earlier_run


def test_overwrite_never_deletes_through_a_checkpoint_linked_to_another_runs(tmp_path):
    """t81: `run.overwrite=true` in a run whose checkpoints/step_3 links to another run's checkpoint
    ended in a raw `OSError: Cannot call rmtree on a symbolic link` (t75 had fixed a linked
    checkpoints/ folder, not a linked entry in it)."""
    from rlpost.controller.run_dir import claim_run_dir

    other, run = tmp_path / "other", tmp_path / "run"
    earlier_run(other)
    earlier_run(run)
    (run / "checkpoints" / "step_3").symlink_to(other / "checkpoints" / "step_2")
    with pytest.raises(
        ConfigError, match=r"^run.overwrite=true would delete through a link \(.*/run/checkpoints/step_3 -> "
    ):
        claim_run_dir(cfg_in(run, "run.overwrite=true"), log=lambda *_: None)
    assert (other / "checkpoints" / "step_2" / "controller.pt").exists()
    assert (run / "checkpoints" / "step_2" / "controller.pt").exists()  # refused before anything went


def test_a_lock_whose_start_is_not_a_time_is_refused_by_name(tmp_path):
    """t18: a `run.lock` written by hand with `"since": "yesterday"` ended in a raw TypeError."""
    from rlpost.controller.run_dir import LOCK, claim_run_dir

    (tmp_path / LOCK).write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": "yesterday"}))
    with pytest.raises(ConfigError, match=r"in use by another run \(pid 1 on host elsewhere, since 'yesterday'\); "):
        claim_run_dir(cfg_in(tmp_path), log=lambda *_: None)


def test_a_lora_rank_above_the_models_hidden_size_is_refused_before_the_actors(tmp_path):
    """t14: `model.lora.rank=100000` started the actors and ran out of memory in Ray after 144 s."""
    from rlpost.config import load_config
    from rlpost.controller.setup import check_lora_targets
    from tests.helpers import save_tiny_model

    save_tiny_model(tmp_path / "m", hidden=32, intermediate=64)
    for targets in ("[all-linear]", "[q_proj]"):
        cfg = load_config(["+recipe=quickstart", "model.lora.rank=33", f"model.lora.target_modules={targets}"])
        with pytest.raises(ConfigError, match=r"^model.lora.rank=33 is above .*/m's hidden size \(32\): the adapters "):
            check_lora_targets(cfg, str(tmp_path / "m"))
    check_lora_targets(load_config(["+recipe=quickstart", "model.lora.rank=32"]), str(tmp_path / "m"))


def test_a_sigint_while_the_command_imports_is_one_line(monkeypatch, capsys):
    """t74: Ctrl-C 3.5 s into `rlpost train`, while it imported its libraries, printed a raw
    KeyboardInterrupt traceback from triton's import."""
    from rlpost import cli

    def importing(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_train", importing)
    assert cli.main(["train", "+recipe=quickstart"]) == 130
    assert capsys.readouterr().err == "\nrlpost train: interrupted (SIGINT) as it started: nothing was trained\n"
