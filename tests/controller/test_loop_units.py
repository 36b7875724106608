"""The controller's own bookkeeping, each method on a stand-in holding only what it reads (the
integration tests run them inside whole runs; the mutation run counts only tests without Ray and found
these untested: benchmarks/mutation/mutation_checkpoint_loop_placement.json): what a signal writes
and says, what a resume restores and says, whose metrics an update returns, and the device handed back
before the sync."""

from __future__ import annotations

import json
import random
import signal
import zipfile
from types import SimpleNamespace

import pytest
import torch

from rlpost.config import load_config
from rlpost.controller import checkpoint, loop
from rlpost.controller.loop import Controller
from rlpost.controller.signals import Stopped


def cfg_of(*overrides):
    return load_config(["+recipe=quickstart", *overrides])


def state(step):
    return {"step": step, "version": step, "kl_coef": 0.5 + step, "python_rng": random.getstate(),
            "torch_rng": torch.get_rng_state(), "stream": step}  # fmt: skip


def stopping(tmp_path, step, *overrides):
    """A stand-in controller at `step` whose `save` writes a real checkpoint."""
    c = SimpleNamespace(cfg=cfg_of(*overrides), run_dir=tmp_path, step=step, said=[], saves=[], reports=[])
    c.log, c.report = c.said.append, lambda: c.reports.append(1)
    c.save = lambda: c.saves.append(step) or checkpoint.save(tmp_path, step, state(step), [], keep=5)
    return c


def stop(c, workers_gone=False):
    with pytest.raises(Stopped) as info:
        Controller.stop_on(c, signal.SIGTERM, workers_gone)
    assert info.value.exit_code == 128 + signal.SIGTERM and c.reports == [1]
    return c.said[-1]


def test_a_signal_before_the_first_step_writes_nothing_and_says_so(tmp_path):
    said = stop(stopping(tmp_path, 0))
    assert said == (
        "stopped by SIGTERM after step 0 (no checkpoint); nothing to go on from: run it again (here with "
        "run.overwrite=true, which replaces its logs)"
    )


def test_a_signal_after_a_step_writes_its_checkpoint_once_and_names_it(tmp_path, capsys):
    c = stopping(tmp_path, 1)
    said = stop(c)
    folder = tmp_path / "checkpoints" / "step_1"
    go_on = f"to go on, run the same command with trainer.resume=auto run.dir={tmp_path}"
    assert c.saves == [1] and said == f"stopped by SIGTERM after step 1 (checkpoint {folder}); {go_on}"
    again = stopping(tmp_path, 1)  # the step has its checkpoint already: not written twice
    assert stop(again) == said and again.saves == []
    off = stopping(tmp_path, 2, "trainer.save_on_signal=false")
    assert off.saves == [] and stop(off).endswith(f"(checkpoint {folder}); {go_on}")  # the newest there is
    (tmp_path / "checkpoints" / "step_3").mkdir()  # damaged (no manifest matches): passed over without a word
    (tmp_path / "checkpoints" / "step_3" / "controller.pt").write_bytes(b"x")
    (tmp_path / "checkpoints" / "step_3" / checkpoint.MANIFEST).write_text('{"controller.pt": 9}')
    gone = stopping(tmp_path, 4)
    assert stop(gone, workers_gone=True) == (
        f"stopped by SIGTERM during step 5, which its workers did not finish (checkpoint {folder}); {go_on}"
    )
    assert gone.saves == [] and capsys.readouterr().out == ""  # the workers are gone: nothing to save with


def resuming(tmp_path, resume):
    loaded = []
    c = SimpleNamespace(cfg=cfg_of(f"trainer.resume={resume}"), run_dir=tmp_path, step=0, version=0, said=[],
                        kl=SimpleNamespace(coef=0.25), workers=SimpleNamespace(trained=lambda: []),
                        batches=SimpleNamespace(load_state_dict=loaded.append), loaded=loaded)  # fmt: skip
    c.log = c.said.append
    return c


def test_a_resume_with_no_checkpoint_starts_fresh_and_says_so(tmp_path):
    c = resuming(tmp_path, "auto")
    Controller._resume(c)
    assert c.said == [f"trainer.resume=auto: no complete checkpoint in {tmp_path}, starting fresh"]
    assert (c.step, c.version, c.loaded) == (0, 0, [])


def unreadable_but_intact(folder):
    """controller.pt as a zip whose checksums and size agree with the manifest, but whose pickle is not one:
    only loading it finds that (pickle's UnpicklingError)."""
    path = folder / "controller.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"not a pickle")
    (folder / checkpoint.MANIFEST).write_text(json.dumps({"controller.pt": path.stat().st_size}))


def test_auto_resumes_from_the_newest_readable_checkpoint_and_restores_every_count(tmp_path):
    checkpoint.save(tmp_path, 2, state(2), [], keep=5)
    old = {k: v for k, v in state(3).items() if k != "kl_coef"}  # a checkpoint from before the KL controller
    checkpoint.save(tmp_path, 3, old, [], keep=5)
    newest = checkpoint.save(tmp_path, 4, state(4), [], keep=5)
    unreadable_but_intact(newest)
    c = resuming(tmp_path, "auto")
    Controller._resume(c)
    step_3 = tmp_path / "checkpoints" / "step_3"
    assert (c.step, c.version, c.kl.coef) == (3, 3, 0.25)  # no kl_coef saved: its own kept
    assert c.loaded[0]["stream"] == 3
    assert "could not be read" in c.said[0] and c.said[0].endswith(f"going on from the checkpoint before it, {step_3}")
    assert c.said[1] == f"resumed from {step_3} (step 3, weight version 3)"
    named = resuming(tmp_path, str(newest))  # named by hand: its damage is refused, not passed over
    with pytest.raises(checkpoint.CheckpointError, match="could not be read"):
        Controller._resume(named)


def test_a_resume_says_which_damaged_checkpoint_find_passed_over(tmp_path):
    checkpoint.save(tmp_path, 2, state(2), [], keep=5)
    newest = checkpoint.save(tmp_path, 4, state(4), [], keep=5)
    (newest / "controller.pt").write_bytes(b"cut")  # another size than its manifest's
    c = resuming(tmp_path, "auto")
    Controller._resume(c)
    assert c.said[0].startswith(f"checkpoint {newest} is damaged (controller.pt has 3 bytes")
    assert (c.step, c.kl.coef) == (2, 2.5)


def test_an_update_counts_a_version_and_returns_rank_0s_metrics(monkeypatch):
    monkeypatch.setattr(loop, "shard_batch", lambda batch, plan: ["shard0", "shard1"])
    results = [({"actor/loss": 0.5}, "lp0"), ({"actor/loss": 0.7}, "lp1")]
    calls = []
    trainers = SimpleNamespace(call_sharded=lambda *a: calls.append(a) or results)
    c, timing = SimpleNamespace(trainers=trainers, version=3, step=6), {}
    assert Controller._update(c, "batch", "plan", True, False, timing) == {"actor/loss": 0.5}
    assert c.version == 4 and calls == [("update", ["shard0", "shard1"], True, 7)] and "timing_s/update" in timing


def test_after_the_update_colocated_trainers_hand_the_device_back_before_the_sync():
    order = []
    group = SimpleNamespace(call=lambda method: order.append(method))
    c = SimpleNamespace(cfg=cfg_of(), step=4, workers=SimpleNamespace(trained=lambda: [group]))
    c._hand_device = lambda to: Controller._hand_device(c, to)
    c.sync_weights = lambda: order.append("sync") or {"weight_sync/version": 5.0}
    c.batches = SimpleNamespace(synced=lambda step: order.append(f"synced {step}"))
    assert Controller._sync_after_update(c) == {"weight_sync/version": 5.0}
    assert order == ["release_memory", "sync", "synced 5"]
