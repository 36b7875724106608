"""controller/checkpoint.py without actors: `save` with groups that write a file each (the folder,
its manifest, replacing a step, keeping the newest, a failed write), the order of complete
checkpoints, `select`'s and `find`'s messages, `load` refusing another model's checkpoint, and
`export` handing the run's settings to the loaders (faked: what each is called with)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import ray.exceptions
import torch

from rlpost.config import ConfigError, load_config, to_yaml
from rlpost.controller import checkpoint
from rlpost.controller import export as exporting
from tests.helpers import controller_bytes


class Group:
    """An actor group whose every call writes `<role>/state.bin` (4 bytes) into the folder."""

    def __init__(self, role="trainer", fail=None):
        self.role, self.fail, self.calls = role, fail, []

    def call(self, method, folder):
        self.calls.append((method, folder))
        if self.fail is not None:
            raise self.fail
        (Path(folder) / self.role).mkdir()
        (Path(folder) / self.role / "state.bin").write_bytes(b"abcd")


def steps(run_dir):
    """Every folder under checkpoints/, by step."""
    return sorted((p.name for p in (run_dir / "checkpoints").iterdir()), key=lambda n: int(n.split("_")[-1]))


def test_a_save_writes_every_group_and_the_controller_then_a_manifest_one_file_a_line(tmp_path):
    actor, critic = Group("trainer"), Group("critic")
    final = checkpoint.save(tmp_path / "run", 4, {"step": 4, "seed": 1}, [actor, critic], keep=0)
    assert final == tmp_path / "run" / "checkpoints" / "step_4" and steps(tmp_path / "run") == ["step_4"]
    tmp = str(tmp_path / "run" / "checkpoints" / ".tmp_step_4")  # written under a temporary name
    assert actor.calls == [("save_checkpoint", tmp)] and critic.calls == [("save_checkpoint", tmp)]
    assert torch.load(final / "controller.pt") == {"step": 4, "seed": 1}
    size = (final / "controller.pt").stat().st_size
    assert (final / "manifest.json").read_text() == (
        f'{{\n"controller.pt": {size},\n"critic/state.bin": 4,\n"trainer/state.bin": 4\n}}'
    )
    assert checkpoint.damage(final) is None


def test_a_step_saved_again_replaces_the_old_folder_and_a_stale_temporary_one_is_cleared(tmp_path):
    stale = tmp_path / "checkpoints" / ".tmp_step_2"
    stale.mkdir(parents=True)
    (stale / "half_written.bin").write_bytes(b"x")
    checkpoint.save(tmp_path, 2, {"step": 2}, [Group()], keep=0)
    (tmp_path / "checkpoints" / "step_2" / "extra").write_bytes(b"y")
    checkpoint.save(tmp_path, 2, {"step": 2, "again": True}, [Group()], keep=0)
    final = tmp_path / "checkpoints" / "step_2"
    assert sorted(p.name for p in final.iterdir()) == ["controller.pt", "manifest.json", "trainer"]
    assert torch.load(final / "controller.pt") == {"step": 2, "again": True} and steps(tmp_path) == ["step_2"]


@pytest.mark.parametrize("keep, left", [(0, [2, 4, 9, 10]), (1, [10]), (2, [9, 10]), (5, [2, 4, 9, 10])])
def test_only_the_newest_keep_checkpoints_are_kept(tmp_path, keep, left):
    for step in (2, 4, 9, 10):  # 10 after 9: by number, not by name
        checkpoint.save(tmp_path, step, {"step": step}, [], keep=keep)
    assert steps(tmp_path) == [f"step_{s}" for s in left]
    assert checkpoint.complete_checkpoints(tmp_path) == [tmp_path / "checkpoints" / f"step_{s}" for s in left]


def test_an_old_checkpoint_that_cannot_be_removed_does_not_fail_the_save(tmp_path, monkeypatch):
    """A file system that refuses to remove step_2 (rmtree's errors ignored, as asked, else raised)."""
    real = checkpoint.shutil.rmtree

    def refusing(path, ignore_errors=False, **kwargs):
        if Path(path).name == "step_2":
            if not ignore_errors:
                raise PermissionError(f"cannot remove {path}")
            return
        real(path, ignore_errors=ignore_errors, **kwargs)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", refusing)
    for step in (2, 4):
        checkpoint.save(tmp_path, step, {"step": step}, [], keep=1)
    assert steps(tmp_path) == ["step_2", "step_4"]


def test_a_failed_first_save_names_the_actors_cause_and_no_older_checkpoint(tmp_path):
    error = RuntimeError("the actor died")
    error.cause = OSError(28, "No space left on device")  # what a Ray task error carries
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.save(tmp_path, 3, {"step": 3}, [Group(fail=error)], keep=2)
    assert str(info.value) == (
        f"writing checkpoint {tmp_path / 'checkpoints' / 'step_3'} failed: OSError: [Errno 28] No space left on "
        "device; the newest complete checkpoint is none; free space there, then run again with run.overwrite=true (no "
        "checkpoint to go on from)"
    )
    assert steps(tmp_path) == []  # the temporary folder is gone


def test_a_save_where_the_checkpoints_folder_cannot_be_made_is_a_checkpoint_error(tmp_path):
    (tmp_path / "checkpoints").write_text("a file")
    with pytest.raises(checkpoint.CheckpointError, match="failed: NotADirectoryError"):
        checkpoint.save(tmp_path, 1, {"step": 1}, [], keep=0)


def test_select_names_the_complete_steps(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"step_<N> with controller.pt\); train with trainer.save_every=N"):
        checkpoint.select(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"complete ones: steps none$"):
        checkpoint.select(tmp_path, 3)
    for step in (4, 10):
        checkpoint.save(tmp_path, step, {"step": step}, [], keep=0)
    assert checkpoint.select(tmp_path) == tmp_path / "checkpoints" / "step_10"
    len_saved = (tmp_path / "checkpoints" / "step_10" / "controller.pt").stat().st_size
    with pytest.raises(FileNotFoundError, match=r"complete ones: steps \[4, 10\]$"):
        checkpoint.select(tmp_path, 3)
    newest = tmp_path / "checkpoints" / "step_10"
    (newest / "controller.pt").write_bytes(b"cut")  # damaged: another size than its manifest says
    said = []
    assert checkpoint.select(tmp_path, log=said.append) == tmp_path / "checkpoints" / "step_4"  # passed over
    assert said == [f"checkpoint {newest} is damaged (controller.pt has 3 bytes, the manifest says {len_saved}); "
                    "trying the one before it"]  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"step_10 is damaged: controller.pt has 3 bytes, the manifest "
                       r"says \d+; intact ones: steps \[4\]$"):  # fmt: skip
        checkpoint.select(tmp_path, 10)
    (tmp_path / "checkpoints" / "step_4" / checkpoint.MANIFEST).unlink()
    with pytest.raises(FileNotFoundError, match=r"every checkpoint in .* is damaged \(said above\)$"):
        checkpoint.select(tmp_path, log=lambda *_: None)


def test_a_folder_that_is_no_checkpoint_and_no_run_is_not_called_a_run(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        checkpoint.find(tmp_path, str(tmp_path / "elsewhere"))
    assert str(info.value).endswith("is not a complete checkpoint (no controller.pt)")


def test_load_refuses_a_checkpoint_the_actors_refuse_and_passes_other_errors_on(tmp_path):
    state = {"step": 2, "pending": [SimpleNamespace(rows=["a"])]}  # batches not trained yet: objects, not tensors
    folder = checkpoint.save(tmp_path, 2, state, [], keep=0)
    ok = Group()
    ok.call = lambda method, path: ok.calls.append((method, path))
    assert checkpoint.load(folder, [ok]) == state and ok.calls == [("load_checkpoint", str(folder))]
    refused = Group("critic", fail=ray.exceptions.RayTaskError("load", "tb", ValueError("size mismatch for w")))
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.load(folder, [refused])
    assert str(info.value) == f"critic could not load checkpoint {folder}: size mismatch for w"
    crashed = Group(fail=ray.exceptions.RayTaskError("load", "tb", KeyError("w")))
    with pytest.raises(ray.exceptions.RayTaskError):
        checkpoint.load(folder, [crashed])


# ---------------------------------------------------------------------------------------- export
@pytest.fixture
def loaders(monkeypatch):
    """The loaders `export` calls, recording their arguments; the model records its dtype."""
    import torch.distributed.checkpoint as dcp

    from rlpost.models import loading, lora
    from rlpost.tiny import build

    calls = {}

    class Model:
        def state_dict(self):
            return {}

        def to(self, dtype):
            calls["dtype"] = dtype
            return self

        def save_pretrained(self, out):
            calls["saved"] = out

    monkeypatch.setattr(
        build, "resolve_model_path", lambda m, d, log, describe: calls.update(resolve=(m, d, log, describe)) or "/base"
    )
    monkeypatch.setattr(lora, "export_merged", lambda *a: calls.update(merged=a))
    monkeypatch.setattr(loading, "load_causal_lm", lambda *a, **k: calls.update(lm=(a, k)) or Model())
    tokenizer = SimpleNamespace(save_pretrained=lambda out: calls.update(tokenizer_saved=out))
    monkeypatch.setattr(loading, "load_tokenizer", lambda *a: calls.update(tokenizer=a) or tokenizer)
    monkeypatch.setattr(dcp, "load", lambda state, checkpoint_id: calls.update(dcp=checkpoint_id))
    return calls


def exported_run(tmp_path, *overrides):
    cfg = load_config(["+recipe=quickstart", "model.trust_remote_code=true", "model.dtype=bfloat16", *overrides])
    run = tmp_path / "run"
    folder = run / "checkpoints" / "step_3"
    (folder / "trainer").mkdir(parents=True)
    (folder / "controller.pt").write_bytes(controller_bytes())
    size = (folder / "controller.pt").stat().st_size
    (folder / checkpoint.MANIFEST).write_text(f'{{"controller.pt": {size}}}')  # intact, as far as export checks
    (folder / "trainer" / ".metadata").write_bytes(b"")
    (run / "config.yaml").write_text(to_yaml(cfg))
    return cfg, run, folder


def test_export_of_full_weights_into_an_empty_existing_folder(tmp_path, loaders):
    cfg, run, folder = exported_run(tmp_path)
    out = tmp_path / "hf"
    out.mkdir()  # empty: fine
    said = []
    assert exporting.export(run, out, log=said.append) == out
    model_cfg, data_cfg, log, describe = loaders["resolve"]
    assert (model_cfg.path, data_cfg.task, log, describe) == (cfg.model.path, cfg.data.task, said.append, False)
    assert loaders["lm"] == (("/base", "float32"), {"trust_remote_code": True})
    assert loaders["dcp"] == str(folder / "trainer") and loaders["dtype"] == torch.bfloat16
    assert loaders["saved"] == loaders["tokenizer_saved"] == out and loaders["tokenizer"] == ("/base", True)
    assert said == [f"loading {folder / 'trainer'} into /base", f"exported {folder} to {out}"]
    (out / "file").write_text("x")
    with pytest.raises(FileExistsError, match="exists and is not an empty folder"):
        exporting.export(run, out)


def test_export_of_a_lora_run_merges_its_adapter_into_a_new_nested_folder(tmp_path, loaders):
    _, run, folder = exported_run(tmp_path, "model.lora.rank=1")
    out = tmp_path / "a" / "b" / "hf"
    with pytest.raises(FileNotFoundError) as info:
        exporting.export(run, out, dtype="float32")
    assert str(info.value) == (
        f"{folder / 'adapter' / 'adapter_model.safetensors'} not found: a LoRA run's checkpoint keeps its adapter there"
    )
    (folder / "adapter").mkdir()
    (folder / "adapter" / "adapter_model.safetensors").write_bytes(b"")
    said = []
    exporting.export(run, out, dtype="float32", log=said.append)
    assert loaders["merged"] == ("/base", folder / "adapter", out, "float32", True)
    assert said == [f"merging {folder / 'adapter'} into /base", f"exported {folder} to {out}"]


def test_export_without_the_sharded_weights_names_the_file(tmp_path, loaders):
    _, run, folder = exported_run(tmp_path)
    (folder / "trainer" / ".metadata").unlink()
    with pytest.raises(FileNotFoundError) as info:
        exporting.export(run, tmp_path / "hf")
    assert str(info.value) == f"{folder / 'trainer' / '.metadata'} not found: not a complete trainer checkpoint"


def damaged_step(run, step):
    """A complete-looking `step_<step>` whose controller.pt is not the size its manifest says."""
    folder = run / "checkpoints" / f"step_{step}"
    folder.mkdir(parents=True)
    (folder / "controller.pt").write_bytes(b"cut")
    (folder / checkpoint.MANIFEST).write_text('{"controller.pt": 10}')
    return folder


def test_export_says_on_its_log_which_damaged_checkpoint_it_passed_over(tmp_path, loaders):
    _, run, _ = exported_run(tmp_path)
    newest = damaged_step(run, 5)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "file").write_text("x")  # refused after the checkpoint is chosen: nothing is loaded
    said = []
    with pytest.raises(FileExistsError):
        exporting.export(run, out, log=said.append)
    assert said == [
        f"checkpoint {newest} is damaged (controller.pt has 3 bytes, the manifest says 10); trying the one before it"
    ]


def test_select_of_a_damaged_step_with_no_intact_one_says_none(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        checkpoint.select(tmp_path)
    assert str(info.value) == (
        f"no complete checkpoint in {tmp_path / 'checkpoints'} (a folder step_<N> with controller.pt); train with "
        "trainer.save_every=N"
    )
    folder = damaged_step(tmp_path, 4)
    with pytest.raises(FileNotFoundError) as info:
        checkpoint.select(tmp_path, 4)
    assert str(info.value) == (
        f"{folder} is damaged: controller.pt has 3 bytes, the manifest says 10; intact ones: steps none"
    )


def test_a_resume_check_passes_over_a_damaged_checkpoint_without_a_word(tmp_path, capsys):
    """The loop names the damaged checkpoint when it resumes; the check before it says nothing."""
    run = tmp_path / "run"
    checkpoint.save(run, 3, {"step": 3}, [], keep=0)
    damaged_step(run, 5)
    cfg = load_config(["+recipe=quickstart", "trainer.resume=auto", "trainer.total_steps=10"])
    checkpoint.check_resume(cfg, run)
    assert capsys.readouterr().out == ""


def test_a_resume_under_other_lora_settings_names_every_key_that_differs(tmp_path):
    lora = ["model.lora.rank=8", "model.lora.target_modules=[q_proj]"]
    run = tmp_path / "run"
    checkpoint.save(run, 3, {"step": 3}, [], keep=0)
    (run / "config.yaml").write_text(to_yaml(load_config(["+recipe=quickstart", *lora])))
    here = ["trainer.resume=auto", "model.lora.rank=4", "model.lora.target_modules=[v_proj]"]
    cfg = load_config(["+recipe=quickstart", *here])
    with pytest.raises(ConfigError) as info:
        checkpoint.check_resume(cfg, run)
    assert str(info.value) == (
        f"trainer.resume=auto: {run / 'checkpoints' / 'step_3'} was saved by a run with other settings: "
        "model.lora.rank=8 there, 4 here; model.lora.target_modules=['q_proj'] there, ['v_proj'] here. Resume "
        "with that run's settings, or start a new run.dir"
    )


def test_going_back_to_an_older_checkpoint_of_its_own_folder_is_refused_while_newer_ones_follow(tmp_path):
    """The fourteenth catalogue's t10: trainer.resume=.../step_4 in its own run, where step_6
    followed, trained a second history there: keep_checkpoints rotated step_4 away and kept step_6 as
    the newest, and resume=auto later went on from the other history. Into another run.dir, or from
    the newest checkpoint, it goes on."""
    run = tmp_path / "run"
    for step in (4, 6):
        checkpoint.save(run, step, {"step": step}, [], keep=0)
    back = run / "checkpoints" / "step_4"
    cfg = load_config(["+recipe=quickstart", f"trainer.resume={back}", "trainer.total_steps=8"])
    with pytest.raises(ConfigError) as info:
        checkpoint.check_resume(cfg, run)
    assert str(info.value) == (
        f"trainer.resume={back} goes back to step 4 in its own run folder, where newer checkpoints follow (step_6): "
        "training on there would mix two histories. Resume into a new folder (run.dir=NEW with this trainer.resume), "
        f"go on from the newest (trainer.resume=auto), or move step_6 out of {run / 'checkpoints'} first"
    )
    checkpoint.check_resume(cfg, tmp_path / "new")  # another folder: a branch of its own
    newest = load_config(
        ["+recipe=quickstart", f"trainer.resume={run / 'checkpoints' / 'step_6'}", "trainer.total_steps=8"]
    )
    checkpoint.check_resume(newest, run)
    checkpoint.check_resume(load_config(["+recipe=quickstart", "trainer.resume=auto", "trainer.total_steps=8"]), run)


def test_auto_passes_over_a_controller_state_it_cannot_read_as_its_message_says(tmp_path, monkeypatch):
    """Going back by hand past a checkpoint is refused in its own folder (above), so `auto` must be
    the way past one whose controller.pt cannot be read (damaged at the same size, which only reading
    finds), as the refusal of an explicit resume of it says."""
    run = tmp_path / "run"
    for step in (4, 6):
        checkpoint.save(run, step, {"step": step}, [], keep=0)
    real = torch.load

    def load(path, **kwargs):
        if "step_6" in str(path):
            raise RuntimeError("PytorchStreamReader failed reading zip archive")
        return real(path, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    newest, said = run / "checkpoints" / "step_6", []
    assert checkpoint.load_intact(newest, [], auto=True, log=said.append) == (
        (run / "checkpoints" / "step_4").resolve(),
        {"step": 4},
    )
    assert said[0].endswith(
        f"trainer.resume=auto: going on from the checkpoint before it, {(run / 'checkpoints' / 'step_4').resolve()}"
    )
    with pytest.raises(
        checkpoint.CheckpointError, match=r"could not be read \(RuntimeError: .*\); trainer.resume=auto passes over it"
    ):
        checkpoint.load_intact(newest, [], auto=False)
