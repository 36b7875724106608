"""The trainer's checkpoint, in one process: an actor that trains, saves and trains on ends bit for
bit where a new actor that loads the checkpoint and trains on ends (model, Adam's states on the
device or layerwise on the host, the schedule, the RNG; with LoRA too), a LoRA checkpoint holds the
adapter only (and `adapter/`, a peft folder of it), and a checkpoint of another LoRA setting, one
missing a trainable parameter or holding a key the model lacks, or optimizer states of another
model are refused by name. The whole loop's resume (data order, one-step-off batches, samples) is
tests/integration/test_resume.py."""

import copy
import json
import re

import pytest
import torch

import rlpost.trainer.checkpoint as checkpoint
from rlpost.weightsync.transport import free_port
from tests.actor_batches import LORA, config, shards_for
from tests.helpers import save_tiny_model


def state_of(worker) -> dict:
    from rlpost.trainer.fsdp import full_tensor

    optimizer = copy.deepcopy(worker.optimizer.state_dict())  # torch's holds the live state tensors
    return {
        "params": {n: full_tensor(p.detach()).clone() for n, p in worker.model.named_parameters()},
        "optimizer": optimizer["state"] if "state" in optimizer else optimizer,
        "lr": worker.engine.scheduler.get_last_lr(),
        "rng": torch.get_rng_state(),
    }


def assert_same(a, b, where=""):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def trainable_names(worker) -> list[str]:
    return [n for n, p in worker.model.named_parameters() if p.requires_grad]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("offload", ["none", "layerwise"])
def test_save_train_on_equals_load_train_on(tmp_path, offload, lora):
    """With LoRA the checkpoint holds the adapter only and the frozen base comes from model.path:
    the resumed actor still ends bit for bit where the straight one does."""
    from rlpost.roles.actor import ActorWorker

    model, _ = save_tiny_model(tmp_path / "model")
    cfg = config(f"trainer.optim.offload={offload}", *(LORA if lora else []))
    shards = shards_for(model, cfg)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    try:
        worker.update(shards[0])
        torch.rand(5)  # as dropout would: the RNG is no longer where a fresh start leaves it
        saved = state_of(worker)
        worker.save_checkpoint(str(folder))
        torch.manual_seed(123)  # the RNG moves on after the save: the load must bring it back
        worker.update(shards[1])
        straight = state_of(worker)
    finally:
        worker.shutdown()
    assert (folder / "adapter").is_dir() == lora
    resumed = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    try:
        fresh = state_of(resumed)["params"]
        assert any(not torch.equal(fresh[n], saved["params"][n]) for n in trainable_names(resumed))
        resumed.load_checkpoint(str(folder))
        assert_same(state_of(resumed), saved, "loaded")
        torch.manual_seed(123)
        resumed.update(shards[1])
        assert_same(state_of(resumed), straight, "trained on")
    finally:
        resumed.shutdown()
    assert straight["lr"] != saved["lr"]  # the warm-up schedule moved: restoring it matters
    moved = [n for n in straight["params"] if not torch.equal(straight["params"][n], saved["params"][n])]
    assert all(".lora_" in n for n in moved) if lora else "model.norm.weight" in moved


@pytest.mark.parametrize("offload", ["none", "layerwise"])
def test_a_lora_checkpoint_holds_the_adapter_only(tmp_path, offload):
    """`trainer/` holds exactly the trainable (adapter) parameters and, with Adam on the device,
    their optimizer states (layerwise: none, they are in the rank's file, which torch's AdamW
    leaves empty); `adapter/`, written by rank 0, is a peft folder of the adapter weights under
    peft's keys, equal to the model's, naming the base model."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from rlpost.roles.actor import ActorWorker
    from rlpost.trainer.fsdp import full_tensor

    model, _ = save_tiny_model(tmp_path / "model")
    cfg = config(f"trainer.optim.offload={offload}", *LORA)
    worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    try:
        worker.update(shards_for(model, cfg, seeds=(1,))[0])  # lora_B leaves 0: the files are not a fresh start
        trainable = trainable_names(worker)
        adapter = {
            n.replace(".default.", "."): full_tensor(p.detach()).clone()
            for n, p in worker.model.named_parameters()
            if ".lora_" in n
        }
        worker.save_checkpoint(str(tmp_path / "ckpt"))
    finally:
        worker.shutdown()
    assert len(trainable) == 2 * 7 * 2 and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    keys = set(dcp.FileSystemReader(str(tmp_path / "ckpt" / "trainer")).read_metadata().state_dict_metadata)
    assert {k.removeprefix("model.") for k in keys if k.startswith("model.")} == set(trainable)
    assert all(k.startswith(("model.", "optimizer.")) for k in keys)
    adam = {f"optimizer.state.{n}.{s}" for n in trainable for s in ("step", "exp_avg", "exp_avg_sq")}
    assert {k for k in keys if k.startswith("optimizer.state.")} == (adam if offload == "none" else set())
    extra = torch.load(tmp_path / "ckpt" / "trainer_rank0.pt", weights_only=False)
    assert (extra["optimizer"] is None) == (offload == "none")

    files = load_file(str(tmp_path / "ckpt" / "adapter" / "adapter_model.safetensors"))
    assert files.keys() == adapter.keys()
    for name, value in adapter.items():
        assert files[name].dtype == torch.float32 and torch.equal(files[name], value), name
    assert not all(torch.equal(v, torch.zeros_like(v)) for n, v in adapter.items() if ".lora_B." in n)
    config_json = json.loads((tmp_path / "ckpt" / "adapter" / "adapter_config.json").read_text())
    assert (config_json["r"], config_json["lora_alpha"]) == (4, 8.0)
    assert config_json["base_model_name_or_path"] == str(tmp_path / "model")


def refused(folder, missing, unexpected) -> str:
    return re.escape(
        f"checkpoint {folder}: trainable parameters {missing} not in it, or keys {unexpected} the model does not have"
    )


def test_a_checkpoint_missing_a_trainable_parameter_is_refused(tmp_path, monkeypatch):
    """A checkpoint that brings no value for one adapter parameter would leave it at its fresh
    start: the load names it. (DCP itself refuses keys the checkpoint lacks, so the checkpoint
    is loaded here through a state that leaves one out.)"""
    from rlpost.roles.actor import ActorWorker

    save_tiny_model(tmp_path / "model")
    worker = ActorWorker(config(*LORA), str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    folder = str(tmp_path / "ckpt")
    try:
        worker.save_checkpoint(folder)
        left_out = trainable_names(worker)[5]
        state_dicts = checkpoint.state_dicts

        def without_one(engine):
            state, options = state_dicts(engine)
            del state["model"][left_out]
            return state, options

        monkeypatch.setattr(checkpoint, "state_dicts", without_one)
        with pytest.raises(ValueError, match=refused(folder, [left_out], [])):
            worker.load_checkpoint(folder)
    finally:
        worker.shutdown()


def test_a_checkpoint_with_a_key_the_model_lacks_is_refused(tmp_path, monkeypatch):
    """A key in the model's part of the checkpoint that the model does not have (of another
    model, or renamed) is named, not silently dropped by the non-strict LoRA load."""
    from rlpost.roles.actor import ActorWorker

    save_tiny_model(tmp_path / "model")
    worker = ActorWorker(config(*LORA), str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    folder = str(tmp_path / "ckpt")
    state_dicts = checkpoint.state_dicts

    def with_a_stranger(engine):
        state, options = state_dicts(engine)
        state["model"]["stranger.weight"] = torch.ones(3)
        return state, options

    monkeypatch.setattr(checkpoint, "state_dicts", with_a_stranger)
    try:
        worker.save_checkpoint(folder)
        with pytest.raises(ValueError, match=refused(folder, [], ["stranger.weight"])):
            worker.load_checkpoint(folder)
    finally:
        worker.shutdown()


def test_layerwise_optimizer_states_of_another_model_are_refused(tmp_path):
    """Host states whose sizes do not fit this model's FSDP units (another model or world size)
    are refused by name instead of copied into the wrong buffers."""
    from rlpost.roles.actor import ActorWorker

    save_tiny_model(tmp_path / "model")
    worker = ActorWorker(
        config("trainer.optim.offload=layerwise"), str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port()
    )
    folder = tmp_path / "ckpt"
    try:
        worker.save_checkpoint(str(folder))
        extra = torch.load(folder / "trainer_rank0.pt", weights_only=False)
        extra["optimizer"]["host"][0] = extra["optimizer"]["host"][0][:-2]
        torch.save(extra, folder / "trainer_rank0.pt")
        with pytest.raises(ValueError, match="^optimizer checkpoint was saved for a different model or world size$"):
            worker.load_checkpoint(str(folder))
    finally:
        worker.shutdown()


@pytest.mark.parametrize("saved_with_lora", [True, False])
def test_a_checkpoint_of_another_lora_setting_is_refused(tmp_path, saved_with_lora):
    from rlpost.roles.actor import ActorWorker

    save_tiny_model(tmp_path / "model")
    folder = tmp_path / "ckpt"
    (folder / "adapter" if saved_with_lora else folder).mkdir(parents=True)  # `adapter/`: saved by a LoRA run
    cfg = config() if saved_with_lora else config(*LORA)
    worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    message = (
        f"checkpoint {folder} was saved {'with' if saved_with_lora else 'without'} LoRA, but this run has "
        f"model.lora.rank={0 if saved_with_lora else 4}: resume with the settings of the run that saved it"
    )
    try:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            worker.load_checkpoint(str(folder))
    finally:
        worker.shutdown()


def saved_checkpoint(tmp_path, hidden: int = 32):
    """A tiny model of width `hidden` (in `tmp_path/model_<hidden>`) and its actor's checkpoint, saved."""
    from rlpost.roles.actor import ActorWorker

    model = tmp_path / f"model_{hidden}"
    save_tiny_model(model, hidden=hidden, intermediate=64)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    worker = ActorWorker(config(), str(model), 0, 1, "127.0.0.1", free_port())
    try:
        worker.save_checkpoint(str(folder))
    finally:
        worker.shutdown()
    return folder


def refusal_loading(folder, hidden: int, tmp_path) -> str:
    """What an actor of a tiny model of width `hidden` says, refusing to load `folder`."""
    from rlpost.roles.actor import ActorWorker

    model = tmp_path / f"model_{hidden}"
    if not model.exists():
        save_tiny_model(model, hidden=hidden, intermediate=64)
    worker = ActorWorker(config(), str(model), 0, 1, "127.0.0.1", free_port())
    try:
        with pytest.raises(ValueError) as info:
            worker.load_checkpoint(str(folder))
    finally:
        worker.shutdown()
    return str(info.value)


def test_a_checkpoint_of_another_model_shape_is_refused_by_name(tmp_path):
    said = refusal_loading(saved_checkpoint(tmp_path, hidden=32), 48, tmp_path)
    assert said.startswith("its trainer state does not fit this model (") and "size" in said.lower()
    assert said.endswith("); resume with the model.path and model.lora settings of the run that saved it")


def test_a_damaged_checkpoint_is_said_as_one_not_as_another_model(tmp_path):
    """The eleventh catalogue's t87: 1 MB of random bytes in a `.distcp` file, its size kept, was
    refused as "does not fit this model ... resume with the model.path and model.lora settings of the
    run that saved it", which were the same."""
    folder = saved_checkpoint(tmp_path, hidden=32)
    (part,) = (folder / "trainer").glob("*.distcp")
    data = bytearray(part.read_bytes())
    data[len(data) // 4 :] = torch.randint(0, 256, (len(data) - len(data) // 4,), dtype=torch.uint8).numpy().tobytes()
    part.write_bytes(bytes(data))
    said = refusal_loading(folder, 32, tmp_path)
    assert said.startswith("its trainer state could not be read (") and "does not fit" not in said
    assert "a file of it may be damaged; trainer.resume=auto passes over it to the run's checkpoint before it" in said


def test_a_damaged_per_rank_file_is_said_as_a_damaged_checkpoint(tmp_path):
    """The seventeenth catalogue's t57: `trainer_rank0.pt` zeroed in its second half (its size kept)
    ended a resume in a 64-line traceback (`OSError: [Errno 22] Invalid argument`) from torch.load;
    said as damaged, resume=auto passes over it as over a damaged `.distcp` file."""
    folder = saved_checkpoint(tmp_path, hidden=32)
    (part,) = folder.glob("trainer_rank0.pt")
    data = bytearray(part.read_bytes())
    data[len(data) // 2 :] = bytes(len(data) - len(data) // 2)
    part.write_bytes(bytes(data))
    said = refusal_loading(folder, 32, tmp_path)
    assert said.startswith("its trainer per-rank state could not be read (") and "does not fit" not in said
    assert "a file of it may be damaged; trainer.resume=auto passes over it to the run's checkpoint before it" in said


def test_a_damaged_metadata_file_is_said_once_without_torchs_tracebacks(tmp_path, caplog):
    """The seventeenth catalogue's t59: a damaged `trainer/.metadata` was handled, but each rank printed
    torch.distributed.checkpoint's two logged tracebacks (49 lines) before rlpost's message."""
    folder = saved_checkpoint(tmp_path, hidden=32)
    meta = folder / "trainer" / ".metadata"
    data = bytearray(meta.read_bytes())
    data[len(data) // 2 :] = bytes(len(data) - len(data) // 2)
    meta.write_bytes(bytes(data))
    caplog.clear()
    said = refusal_loading(folder, 32, tmp_path)
    assert said.startswith("its trainer state could not be read (CheckpointException: ")
    logged = [r.getMessage() for r in caplog.records if r.pathname.endswith("state_dict_loader.py")]
    assert logged == []  # DCP's own lines (with exc_info): "Global metadata is not found. Falling back ..."
