"""The critic role against from-scratch references: its values are a value model's outputs at the
position before each response token (packed, padded and shared-prompt layouts alike), its update's gradient is
that of PPO's clipped value loss over the loss tokens written here in plain torch, and its
checkpoint (`critic/`, next to the actor's `trainer/`) restores weights and Adam states."""

import pytest
import torch

from rlpost.config import load_config
from rlpost.weightsync.transport import free_port
from tests.helpers import FAMILIES, FAMILY_IDS, WORLDS, ragged_generation, run_ranks, save_tiny_model

COMMON = [
    "+recipe=ppo",
    "trainer.world_size=1",
    "data.train_batch_size=4",
    "algo.ppo_mini_batch_size=0",  # one optimizer step a batch (the recipe takes 4, of 16 prompts each)
    "rollout.n=2",
    "trainer.micro_batch_size=3",  # three micro-batches of unequal size
    "critic.value_clip=0.05",
    "critic.optim.lr=1e-2",
    "critic.optim.warmup_steps=0",
    "critic.optim.grad_clip=0",  # the gradient handed to the optimizer is the loss's own
]


def grouped_batch():
    """`ragged_generation(0)` with rows in pairs of one prompt (as GRPO's groups: shared_prompt
    runs each once) and a hole in a loss mask."""
    batch, g = ragged_generation(0)
    for key in ("prompt_ids", "prompt_mask"):
        batch[key][1::2] = batch[key][0::2]
    batch["loss_mask"][1, 0] = False
    return batch, g


def worker_and_batch(tmp_path, *extra, family: str = "qwen2-tied"):
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.roles.critic import CriticWorker

    name, tied = FAMILIES[FAMILY_IDS.index(family)]
    save_tiny_model(tmp_path / "model", family=name, tied=tied)
    cfg = load_config(COMMON + list(extra))
    batch, g = grouped_batch()
    worker = CriticWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    shard = shard_batch(batch, step_plan(batch, cfg)[1])[0]
    return cfg, worker, shard, g


def plain_copy(worker, model_dir):
    """The critic's weights in an unsharded value model (the head is initialised at load)."""
    from rlpost.models.loading import load_value_model
    from rlpost.trainer.fsdp import full_tensor

    model = load_value_model(model_dir, "float32")
    model.load_state_dict({n: full_tensor(p.detach()) for n, p in worker.model.named_parameters()})
    return model


def reference_values(model, batch) -> torch.Tensor:
    """One sequence at a time: the value output at the position just before each response token."""
    out = torch.zeros(batch["response_ids"].shape)
    for i in range(len(batch)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i]]
        m = batch["response_mask"][i]
        response = batch["response_ids"][i][m]
        v = model(input_ids=torch.cat([prompt, response])[None]).logits[0, len(prompt) - 1 : -1, 0]
        out[i, : len(response)] = v
    return out


@pytest.mark.parametrize("family", FAMILY_IDS)
@pytest.mark.parametrize("layout", ["padded", "packed", "shared_prompt"])
def test_values_are_the_value_model_before_each_response_token(tmp_path, layout, family):
    cfg, worker, shard, _ = worker_and_batch(tmp_path, f"trainer.layout={layout}", family=family)
    try:
        out = worker.compute_values(shard)
        order = torch.argsort(out["row_index"])
        values = out["values"][order]
        rows = shard.select(torch.argsort(shard["row_index"]))
        with torch.no_grad():
            expected = reference_values(plain_copy(worker, str(tmp_path / "model")), rows)
        assert torch.allclose(values, expected, atol=1e-5)
        assert values[rows["response_mask"]].abs().min() > 0 and (values[~rows["response_mask"]] == 0).all()
    finally:
        worker.shutdown()


def targets(values: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor):
    """(old values, returns) around `values` [b, R] of rows `rows`, a fixed function of row and
    position (no RNG: every rank and the reference agree): old values on both sides of the clip."""
    t = torch.arange(values.shape[1])[None, :].float()
    r = rows[:, None].float()
    return (values + 0.15 * torch.sin(7 * r + 3 * t)) * mask, (values + torch.cos(5 * r + 2 * t)) * mask


def critic_rank(rank, world, port, model_dir, batch_path, out):
    """One critic update on this rank's shard; rank 0 saves the starting weights, the gradient
    handed to the optimizer and the metrics."""
    import torch.distributed as dist

    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.roles.critic import CriticWorker
    from rlpost.trainer.fsdp import full_tensor

    torch.set_num_threads(1)
    layout = "packed" if world == 2 else "shared_prompt"  # both kinds of layout
    cfg = load_config(COMMON + [f"trainer.world_size={world}", f"trainer.layout={layout}"])
    batch = torch.load(batch_path, weights_only=False)
    worker = CriticWorker(cfg, model_dir, rank, world, "127.0.0.1", port)
    try:
        shard = shard_batch(batch, step_plan(batch, cfg)[1])[rank]
        values = worker.compute_values(shard)
        assert torch.equal(values["row_index"], shard["row_index"])  # plan order, as the shard's
        shard["values"], shard["returns"] = targets(values["values"], shard["row_index"], shard["response_mask"])
        start = {n: full_tensor(p.detach()).clone() for n, p in worker.model.named_parameters()}
        grads, step = [], worker.engine.optimizer.step

        def capture(*args, **kwargs):
            grads.append({n: full_tensor(p.grad).clone() for n, p in worker.model.named_parameters()})
            return step(*args, **kwargs)

        worker.engine.optimizer.step = capture
        metrics = worker.update(shard)
        if rank == 0:
            torch.save({"start": start, "grads": grads, "metrics": metrics}, out)
        dist.barrier()
    finally:
        worker.shutdown()


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("world", WORLDS)
def test_update_gradient_is_the_clipped_value_loss(tmp_path, world):
    """At world size 1 and 2 (token-mean over every rank's loss tokens), against the loss written
    here on an unsharded copy, one sequence at a time."""
    from rlpost.models.loading import load_value_model

    save_tiny_model(tmp_path / "model")
    batch, _ = grouped_batch()
    torch.save(batch, tmp_path / "batch.pt")
    run_ranks(critic_rank, world, free_port(), str(tmp_path / "model"), str(tmp_path / "batch.pt"), str(tmp_path / "o"))
    result = torch.load(tmp_path / "o", weights_only=False)
    model = load_value_model(str(tmp_path / "model"), "float32")
    model.load_state_dict(result["start"])
    values = reference_values(model, batch)
    own = batch["loss_mask"]
    old, target = targets(values.detach(), torch.arange(len(batch)), batch["response_mask"])
    clipped = old + (values - old).clamp(-0.05, 0.05)
    loss = 0.5 * torch.maximum((values - target) ** 2, (clipped - target) ** 2)
    loss[own].sum().div(own.sum()).backward()
    assert len(result["grads"]) == 1
    for n, p in model.named_parameters():
        assert torch.allclose(result["grads"][0][n], p.grad, atol=1e-6, rtol=1e-4), n
    metrics = result["metrics"]
    frac = ((clipped - target) ** 2 > (values - target) ** 2)[own].float().mean()
    assert 0 < frac < 1 and abs(metrics["critic/vf_clipfrac"] - float(frac)) < 1e-6
    assert abs(metrics["critic/vf_loss"] - float(loss[own].mean().detach())) < 1e-5
    assert metrics["critic/grad_norm"] > 0


def test_checkpoint_restores_the_critic(tmp_path):
    from rlpost.roles.critic import CriticWorker
    from rlpost.trainer.fsdp import full_tensor

    cfg, worker, shard, g = worker_and_batch(tmp_path, "critic.optim.offload=layerwise")
    shard["values"] = torch.zeros(shard["response_ids"].shape)
    shard["returns"] = torch.randn(shard["response_ids"].shape, generator=g) * shard["response_mask"]
    try:
        worker.update(shard)
        worker.save_checkpoint(str(tmp_path / "ckpt"))
        saved = {n: full_tensor(p.detach()).clone() for n, p in worker.model.named_parameters()}
        worker.update(shard)  # moves on: the restore must bring the saved state back
        after = [worker.update(shard)]
    finally:
        worker.shutdown()
    assert (tmp_path / "ckpt" / "critic" / ".metadata").is_file()
    fresh = CriticWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    try:
        fresh.load_checkpoint(str(tmp_path / "ckpt"))
        for n, p in fresh.model.named_parameters():
            assert torch.equal(full_tensor(p.detach()), saved[n]), n
        fresh.update(shard)
        again = fresh.update(shard)
    finally:
        fresh.shutdown()
    assert again["critic/vf_loss"] == after[0]["critic/vf_loss"]  # the same Adam states and schedule


def test_a_value_models_new_head_is_loaded_without_transformers_report(tmp_path, capfd):
    """The ninth catalogue's n29: every critic worker printed transformers' LOAD REPORT of the
    (meant) missing score head; the report of a reward model's missing head is the one to read."""
    from transformers.utils import logging as hf_logging

    from rlpost.models.loading import load_value_model
    from tests.helpers import save_tiny_model

    save_tiny_model(tmp_path, hidden=32, layers=2, intermediate=64)
    before = hf_logging.get_verbosity()
    load_value_model(str(tmp_path), "float32")
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err and "MISSING" not in out + err
    assert hf_logging.get_verbosity() == before  # the library's level put back


def skipping_rank(rank, world, port, model_dir, batch_path, out):
    """One critic update towards NaN returns: a non-finite gradient norm, a skipped step."""
    import torch
    import torch.distributed as dist

    from rlpost.config import load_config
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.roles.critic import CriticWorker

    torch.set_num_threads(1)
    cfg = load_config(COMMON + [f"trainer.world_size={world}", "trainer.layout=packed"])
    batch = torch.load(batch_path, weights_only=False)
    worker = CriticWorker(cfg, model_dir, rank, world, "127.0.0.1", port)
    try:
        shard = shard_batch(batch, step_plan(batch, cfg)[1])[rank]
        values = worker.compute_values(shard)["values"]
        shard["values"], shard["returns"] = values, torch.full_like(values, float("nan"))
        metrics = worker.update(shard)
        if rank == 0:
            torch.save(metrics, out)
        dist.barrier()
    finally:
        worker.shutdown()


def test_a_skipped_optimizer_step_counts_once_whatever_the_ranks(tmp_path):
    """The eleventh catalogue's t27: a reward of 1e300 gave "2 optimizer steps of the actor were skipped" in a run of 1
    optimizer step: the count was summed over the trainer ranks (the norm is global: all skip)."""
    import torch

    from rlpost.weightsync.transport import free_port
    from tests.helpers import run_ranks, save_tiny_model

    save_tiny_model(tmp_path / "model")
    torch.save(grouped_batch()[0], tmp_path / "batch.pt")
    run_ranks(skipping_rank, 2, free_port(), str(tmp_path / "model"), str(tmp_path / "batch.pt"), str(tmp_path / "o"))
    assert torch.load(tmp_path / "o", weights_only=False)["critic/skipped_steps"] == 1.0
