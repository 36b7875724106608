"""controller/checkpoint.py at the edges its mutation run found untested (2b9f08a,
benchmarks/mutation/mutation_checkpoint_loop_placement.json): a save that fails for a reason that is not
a full disk, a controller.pt that cannot be read with nothing older, the loader's place checked against
a real controller state, and a resume check that leaves settings alone which do not apply."""

from __future__ import annotations

import errno
import random

import numpy as np
import pytest
import yaml

from rlpost.config import ConfigError, load_config, to_yaml
from rlpost.controller import checkpoint


class Failing:
    role = "trainer"

    def __init__(self, error):
        self.error = error

    def call(self, method, folder):
        raise self.error


def test_a_save_that_fails_for_the_actors_own_reason_names_it_and_asks_for_no_free_space(tmp_path):
    error = RuntimeError("ray task failed")
    error.cause = ValueError("a shard of another shape")  # what a Ray task error carries
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.save(tmp_path, 2, {"step": 2}, [Failing(error)], keep=2)
    assert str(info.value) == (
        f"writing checkpoint {tmp_path / 'checkpoints' / 'step_2'} failed: ValueError: a shard of another shape; "
        "the newest complete checkpoint is none"
    )


def test_a_save_refused_by_permissions_names_the_error_without_the_full_disks_advice(tmp_path):
    checkpoint.save(tmp_path, 1, {"step": 1}, [], keep=2)
    denied = PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.save(tmp_path, 2, {"step": 2}, [Failing(denied)], keep=2)
    assert str(info.value) == (
        f"writing checkpoint {tmp_path / 'checkpoints' / 'step_2'} failed: PermissionError: [Errno 13] Permission "
        f"denied; the newest complete checkpoint is {tmp_path / 'checkpoints' / 'step_1'}"
    )


def test_an_unreadable_controller_state_with_nothing_older_says_so(tmp_path):
    folder = checkpoint.save(tmp_path, 3, {"step": 3}, [], keep=2)
    size = (folder / "controller.pt").stat().st_size  # damaged at the same size: only reading it finds it
    (folder / "controller.pt").write_bytes(b"n" * size)  # (pickle's UnpicklingError, not one of torch's)
    with pytest.raises(checkpoint.CheckpointError, match="could not be read .*; no older one is left$"):
        checkpoint.load(folder, [])
    assert checkpoint.older_than(tmp_path / "elsewhere" / "checkpoints" / "step_1") == []  # not among them


class Loader:
    """A loader that knows its rows: another data set's place in them is refused, with the data's words."""

    def load_state_dict(self, state):
        if state["rows"] != 10:
            raise ValueError(f"the checkpoint counted {state['rows']} rows, this data has 10")


def resumed(run, *overrides):
    return load_config(["+recipe=quickstart", f"run.dir={run}", "trainer.total_steps=9", *overrides])


def test_the_loaders_place_is_checked_in_a_controller_state_as_the_loop_writes_it(tmp_path, capsys):
    run = tmp_path / "run"
    state = {"loader": {"rows": 7}, "python_rng": random.getstate(), "numpy_rng": np.random.get_state()}
    checkpoint.save(run, 2, state, [], keep=2)
    with pytest.raises(ValueError, match="counted 7 rows, this data has 10"):
        checkpoint.check_data_place(resumed(run, "trainer.resume=auto"), Loader())
    newest = checkpoint.save(run, 4, {**state, "loader": {"rows": 10}}, [], keep=2)
    checkpoint.check_data_place(resumed(run, "trainer.resume=auto"), Loader())  # fits: nothing said
    (newest / "controller.pt").write_bytes(b"cut short")  # damaged: auto goes back to step 2 without a word
    with pytest.raises(ValueError, match="counted 7 rows"):
        checkpoint.check_data_place(resumed(run, "trainer.resume=auto"), Loader())
    assert capsys.readouterr().out == ""


def test_a_resume_leaves_the_tiny_models_shape_alone_where_the_model_is_not_the_tiny_one(tmp_path):
    model = tmp_path / "m"  # a model folder (the saved config is read with this machine's rules)
    model.mkdir()
    (model / "config.json").write_text("{}")
    run, other = tmp_path / "run", [f"model.path={model}", "model.tiny.hidden_size=32"]
    checkpoint.save(run, 3, {"step": 3}, [], keep=2)
    (run / "config.yaml").write_text(to_yaml(load_config(["+recipe=quickstart", *other], this_machine=False)))
    here = ["+recipe=quickstart", "trainer.resume=auto", f"model.path={model}", "model.tiny.hidden_size=64"]
    checkpoint.check_resume(
        load_config(here, this_machine=False), run
    )  # the tiny shape is not this model's: no refusal
    (run / "config.yaml").write_text(to_yaml(load_config(["+recipe=quickstart", "model.tiny.hidden_size=32"])))
    tiny = ["+recipe=quickstart", "trainer.resume=auto", "model.tiny.hidden_size=64"]
    with pytest.raises(ConfigError, match="model.tiny.hidden_size=32 there, 64 here"):
        checkpoint.check_resume(load_config(tiny), run)


def test_a_config_yaml_that_cannot_be_read_is_named_with_the_first_line_of_the_reason(tmp_path):
    (tmp_path / "config.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        checkpoint.run_config(tmp_path)
    first = str(info.value).split(": not a config rlpost can read: ")[1].split(";")[0]
    with pytest.raises(yaml.YAMLError) as raw:
        yaml.safe_load("model: [unclosed\n")
    assert first == str(raw.value).strip().splitlines()[0] and "\n" not in str(info.value)


def test_a_folder_with_a_config_that_is_not_named_checkpoints_is_not_called_a_runs_checkpoints_folder(tmp_path):
    (tmp_path / "config.yaml").write_text("run: {}\n")
    inner = tmp_path / "exports"
    inner.mkdir()
    with pytest.raises(FileNotFoundError) as info:
        checkpoint.run_config(inner)
    assert "checkpoints folder" not in str(info.value)
