"""`export`'s hold on its --out folder and what it leaves when it fails, with the checkpoint's
reading and the model's writing replaced (tests/controller/test_export.py runs whole exports):
another export's claim, live or left by a killed one; an export that finished into the folder
meanwhile; a failure that must leave the folder as it found it, whatever the clean-up meets."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import rlpost.controller.export as export_mod
from rlpost.controller.export import check_base_model, export

CLAIM = ".rlpost-export"


@pytest.fixture
def fake_run(tmp_path, monkeypatch):
    """A run whose checkpoint `step_3` exports by writing a weights file and a folder (or fails)."""
    run, folder = tmp_path / "run", tmp_path / "run" / "checkpoints" / "step_3"
    folder.mkdir(parents=True)
    cfg = SimpleNamespace(model=SimpleNamespace(dtype="float32", path="tiny"))
    monkeypatch.setattr(export_mod, "run_config", lambda run_dir: cfg)
    monkeypatch.setattr(export_mod, "select", lambda run_dir, step, log=print: folder)
    monkeypatch.setattr(export_mod, "check_base_model", lambda cfg, run_dir: None)
    failure: list[BaseException] = []

    def write(cfg, folder, out_dir, dtype, log=print):
        (out_dir / "model.safetensors").write_text("w")
        (out_dir / "sub").mkdir()
        (out_dir / "sub" / "part.bin").write_text("p")
        if failure:
            raise failure[0]

    monkeypatch.setattr(export_mod, "write_export", write)
    return run, failure


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_claim_left_by_a_killed_export_is_taken_over_and_let_go(fake_run, tmp_path):
    run, _ = fake_run
    out = tmp_path / "out"
    out.mkdir()
    (out / CLAIM).write_text(str(dead_pid()))  # SIGKILL during an export left only its claim
    assert export(run, out, log=lambda *_: None) == out
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "sub"]  # the claim let go


def test_a_live_exports_claim_is_named_and_its_folder_left_alone(fake_run, tmp_path):
    run, _ = fake_run
    out = tmp_path / "out"
    out.mkdir()
    (out / CLAIM).write_text(str(__import__("os").getpid()))  # a live process: it is writing there
    with pytest.raises(FileExistsError, match=r"another export is writing into it \(.*\.rlpost-export\); give another"):
        export(run, out, log=lambda *_: None)
    assert [p.name for p in out.iterdir()] == [CLAIM]


def test_an_export_that_finished_into_the_folder_meanwhile_is_refused_and_kept(fake_run, tmp_path, monkeypatch):
    run, _ = fake_run
    out = tmp_path / "out"

    def claim_after_another(claim: Path) -> None:  # the other export wrote its model between the checks
        (claim.parent / "config.json").write_text("{}")
        claim.write_text("1")

    monkeypatch.setattr(export_mod, "take_claim", claim_after_another)
    with pytest.raises(FileExistsError, match=r"--out .*out exists and is not an empty folder"):
        export(run, out, log=lambda *_: None)
    assert [p.name for p in out.iterdir()] == ["config.json"]  # its model kept, this export's claim gone


@pytest.mark.parametrize("given", [True, False], ids=["empty-folder-given", "folder-made"])
@pytest.mark.parametrize("cleanup_fails", [False, True], ids=["cleanup-ok", "cleanup-meets-errors"])
def test_a_failed_export_leaves_the_folder_as_it_found_it_and_says_its_own_error(
    fake_run, tmp_path, monkeypatch, given, cleanup_fails
):
    """The export's own error comes out, not one of the clean-up's: its removals ignore errors
    (a file another process removed first, a folder it still writes into)."""
    run, failure = fake_run
    out = tmp_path / "out"
    if given:
        out.mkdir()
    failure.append(ValueError("boom"))
    if cleanup_fails:
        real = shutil.rmtree

        def rmtree(path, ignore_errors=False):  # as if each removal met an error on its way
            if not ignore_errors:
                raise OSError("directory not empty")
            real(path, ignore_errors=True)

        monkeypatch.setattr(export_mod.shutil, "rmtree", rmtree)
    with pytest.raises(ValueError, match="boom"):
        export(run, out, log=lambda *_: None)
    assert (sorted(out.iterdir()) == []) if given else not out.exists()


def test_a_base_model_folder_that_is_no_model_is_named_with_the_runs_config(tmp_path):
    empty = tmp_path / "base"
    empty.mkdir()  # there, but without config.json
    cfg = SimpleNamespace(model=SimpleNamespace(path=str(empty)))
    with pytest.raises(FileNotFoundError) as e:
        check_base_model(cfg, tmp_path / "run")
    said = str(e.value)
    assert said.startswith(f"model.path={str(empty)!r}") and "config.json" in said
    assert said.endswith(f"(the run's model.path, in {tmp_path / 'run' / 'config.yaml'})")
