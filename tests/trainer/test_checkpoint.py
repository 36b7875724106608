"""The trainer's checkpoint, in one process: an actor that trains, saves and trains on ends bit for
bit where a new actor that loads the checkpoint and trains on ends (model, Adam's states on the
device or layerwise on the host, the schedule, the RNG), and a checkpoint of another LoRA setting is
refused by name. The whole loop's resume (data order, one-step-off batches, samples) is
tests/integration/test_resume.py."""

import copy

import pytest
import torch

from rlpost.config import load_config
from rlpost.data.batch import Batch
from rlpost.data.padding import left_pad, right_pad
from rlpost.weightsync.transport import free_port
from tests.helpers import reference_logprobs, save_tiny_model


def batch_for(model, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(2, 6, (8,), generator=g)]
    responses = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(1, 5, (8,), generator=g)]
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    response_ids, response_mask = right_pad(responses, 0)
    batch = Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "loss_mask": response_mask.clone(),
        }
    )
    batch["rollout_logprobs"] = reference_logprobs(model, batch)
    batch["old_logprobs"] = batch["rollout_logprobs"].clone()
    batch["advantages"] = torch.randn(8, generator=g)
    return batch


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


@pytest.mark.parametrize("offload", ["none", "layerwise"])
def test_save_train_on_equals_load_train_on(tmp_path, offload):
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.trainer.actor import ActorWorker

    model, _ = save_tiny_model(tmp_path / "model")
    cfg = load_config(
        [
            "+recipe=quickstart",
            "trainer.world_size=1",
            f"trainer.optim.offload={offload}",
            "trainer.optim.lr=1e-2",
            "trainer.optim.warmup_steps=3",
            "data.train_batch_size=4",
            "rollout.n=2",
            "algo.kl_coef=0",
            "trainer.micro_batch_size=3",
        ]
    )
    shards = [shard_batch(b, step_plan(b, cfg)[1])[0] for b in (batch_for(model, 1), batch_for(model, 2))]
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
    resumed = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    try:
        assert not torch.equal(state_of(resumed)["params"]["model.norm.weight"], saved["params"]["model.norm.weight"])
        resumed.load_checkpoint(str(folder))
        assert_same(state_of(resumed), saved, "loaded")
        torch.manual_seed(123)
        resumed.update(shards[1])
        assert_same(state_of(resumed), straight, "trained on")
    finally:
        resumed.shutdown()
    assert straight["lr"] != saved["lr"]  # the warm-up schedule moved: restoring it matters


def test_a_checkpoint_of_another_lora_setting_is_refused(tmp_path):
    from rlpost.trainer.actor import ActorWorker

    save_tiny_model(tmp_path / "model")
    (tmp_path / "ckpt" / "adapter").mkdir(parents=True)  # saved by a LoRA run
    cfg = load_config(["+recipe=quickstart", "trainer.world_size=1", "algo.kl_coef=0"])
    worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    try:
        with pytest.raises(ValueError, match="saved with LoRA, but this run has model.lora.rank=0"):
            worker.load_checkpoint(str(tmp_path / "ckpt"))
    finally:
        worker.shutdown()
