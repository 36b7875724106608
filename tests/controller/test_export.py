"""`rlpost export` of a full fine-tuning checkpoint (no LoRA: the weights come from the sharded
DCP checkpoint) and its errors. A real ActorWorker (FSDP2, one gloo rank, no Ray) saves the
checkpoint; the exported folder holds exactly its weights. (LoRA runs: tests/integration/test_lora_loop.py.)"""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlpost.cli import main
from rlpost.config import load_config, to_yaml
from rlpost.controller.checkpoint import save
from rlpost.weightsync.transport import free_port
from tests.helpers import FAMILIES, FAMILY_IDS, save_tiny_model  # noqa: E402


@pytest.fixture(params=FAMILIES, ids=FAMILY_IDS)
def run_dir(tmp_path, request):
    base = tmp_path / "base"
    family, tied = request.param
    save_tiny_model(base, hidden=32, layers=2, intermediate=64, family=family, tied=tied)
    run = tmp_path / "run"
    cfg = load_config(
        [
            "+recipe=quickstart",
            f"model.path={base}",
            "trainer.world_size=1",
            f"run.dir={run}",
            "data.train_batch_size=8",
        ]
    )
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(cfg))
    return cfg, run, base


def test_export_full_finetuning_checkpoint(run_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from rlpost.roles.actor import ActorWorker

    cfg, run, base = run_dir
    worker = ActorWorker(cfg, str(base), 0, 1, "127.0.0.1", free_port())
    try:
        with torch.no_grad():  # "training": every weight moves
            for p in worker.model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        trained = {
            n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in worker.model.named_parameters()
        }
        group = SimpleNamespace(call=lambda method, *args: getattr(worker, method)(*args))  # as the controller calls
        save(run, 3, {"step": 3}, [group], keep=0)  # with its manifest, as a run writes it
    finally:
        worker.shutdown()
    out = tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    assert dict(model.named_parameters()).keys() == trained.keys()
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), trained[name]), name
    assert (Path(out) / "tokenizer.json").is_file() or (Path(out) / "tokenizer_config.json").is_file()
    assert not (out / ".rlpost-export").exists()  # the export's claim on its folder, let go
    busy = tmp_path / "busy"  # the ninth catalogue's n62: two exports into one --out both said they wrote it
    busy.mkdir()
    (busy / ".rlpost-export").write_text(str(os.getpid()))  # a live export's claim: it is writing there
    assert main(["export", str(run), "--out", str(busy)]) == 2
    assert [p.name for p in busy.iterdir()] == [".rlpost-export"]  # its files untouched, none added


def test_export_errors_name_what_is_missing(run_dir, tmp_path, capsys):
    _, run, _ = run_dir
    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "config.yaml not found" in capsys.readouterr().err
    assert main(["export", str(run / "checkpoints" / "step_7"), "--out", str(tmp_path / "o")]) == 2  # cat9's n35
    assert f"it is a checkpoint: give its run, {run} --step 7" in capsys.readouterr().err
    assert main(["export", str(run), "--out", str(tmp_path / "o")]) == 2
    assert "no complete checkpoint in" in capsys.readouterr().err
    (run / "checkpoints" / "step_2").mkdir(parents=True)  # no controller.pt: incomplete
    assert main(["export", str(run), "--step", "2", "--out", str(tmp_path / "o")]) == 2
    assert "step_2 is not a complete checkpoint" in capsys.readouterr().err
