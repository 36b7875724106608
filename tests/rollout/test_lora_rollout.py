"""LoRA on the rollout side, without Ray: the hf engine in adapter mode takes a base sync and an
adapter sync through the real sync protocol and then generates exactly as peft's model of the
trainer's adapter; trainer and rollout agree on the adapter manifest; and the controller's guard
(`check_rollout_serves_adapter`) fails a rollout that serves the base model instead of the
adapter (verl #7014 / #7495)."""

import threading

import pytest
import torch

from rlpost.config import LoraConfig
from rlpost.controller.step import AdapterNotServedError, check_rollout_serves_adapter
from rlpost.data.batch import Batch
from rlpost.models.loading import load_causal_lm
from rlpost.models.lora import apply_lora
from rlpost.rollout.base import SamplingParams
from rlpost.rollout.hf import HFRolloutEngine
from rlpost.trainer.lora import adapter_weights, base_weights
from rlpost.weightsync.kinds import sync_kinds
from rlpost.weightsync.manifest import manifest_of
from rlpost.weightsync.sync import send_weights
from rlpost.weightsync.transport import SyncGroup, free_port
from tests.helpers import (
    FAMILIES,
    FAMILY_IDS,
    lora_config,
    lora_model,
    reference_logprobs,
    save_tiny_model,
    sync_from_thread,
)

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]


@pytest.fixture(scope="module")
def base_dirs(tmp_path_factory):
    """family id -> the folder of a random model of that family, made once."""
    made = {}

    def make(family_id: str = "qwen2-tied"):
        if family_id not in made:
            family, tied = FAMILIES[FAMILY_IDS.index(family_id)]
            folder = tmp_path_factory.mktemp("base")
            save_tiny_model(folder, hidden=32, layers=2, intermediate=64, family=family, tied=tied)
            made[family_id] = str(folder)
        return made[family_id]

    return make


@pytest.fixture
def base_dir(base_dirs, request):
    """Qwen2 with tied embeddings, or the family a test names (indirect parametrization)."""
    return base_dirs(getattr(request, "param", "qwen2-tied"))


def adapter_engine(base_dir):
    return HFRolloutEngine(base_dir, "float32", "cpu", 0, 1, batch_size=16, lora=lora_config())


def test_sync_kinds_per_mode():
    from rlpost.config import TrainConfig

    cfg = TrainConfig()
    assert sync_kinds(cfg, first=True) == sync_kinds(cfg, first=False) == ["full"]
    cfg.model.lora.rank = 8
    assert sync_kinds(cfg, first=True) == sync_kinds(cfg, first=False) == ["merged"]
    cfg.model.lora.mode = "adapter"
    assert sync_kinds(cfg, first=True) == ["base", "adapter"] and sync_kinds(cfg, first=False) == ["adapter"]


@pytest.mark.parametrize("base_dir", FAMILY_IDS, indirect=True)
def test_hf_engine_serves_the_synced_adapter(base_dir):
    trainer = lora_model(base_dir).eval()  # random non-zero B: the adapter changes the outputs
    engine = adapter_engine(base_dir)
    # the rollout expects what the trainer sends (names, shapes, float32), computed independently
    sent = list(adapter_weights(trainer))
    assert engine.adapter_manifest() == manifest_of(sent)
    from rlpost.rollout.vllm_weights import expected_adapter_manifest

    assert expected_adapter_manifest(base_dir, lora_config()) == manifest_of(sent)

    params = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=3)
    base_batch = engine.generate(PROMPTS, params)  # before any adapter sync: the base model
    base_model = load_causal_lm(base_dir, "float32").eval()
    assert (reference_logprobs(base_model, base_batch) - base_batch["rollout_logprobs"]).abs().max() < 1e-5

    stats = sync_from_thread(
        list(base_weights(trainer, torch.float32)),
        engine.weight_manifest(),
        engine.load_weights,
        engine.loaded_tensor,
        0,
    )
    assert stats.readback == stats.tensors == len(engine.weight_manifest())
    stats = sync_from_thread(sent, engine.adapter_manifest(), engine.load_adapter, engine.loaded_adapter_tensor, 0)
    assert stats.readback == stats.tensors == len(sent)  # every adapter tensor read back
    batch = engine.generate(PROMPTS, params)
    diff = (reference_logprobs(trainer, batch) - batch["rollout_logprobs"]).abs()[batch["response_mask"]]
    assert diff.max() < 1e-5, diff.max()
    assert not torch.equal(batch["rollout_logprobs"], base_batch["rollout_logprobs"])


def guard_batch(rollout, policy, base, version=2):
    mask = torch.ones_like(rollout, dtype=torch.bool)
    return Batch(
        {
            "rollout_logprobs": rollout,
            "old_logprobs": policy,
            "ref_logprobs": base,
            "response_mask": mask,
            "loss_mask": mask,
            "weight_version": torch.full((len(rollout),), version),
        }
    )


def test_guard_judges_only_when_conclusive():
    g = torch.Generator().manual_seed(0)
    base = -torch.rand(4, 6, generator=g) * 3
    policy = base - 0.05 * torch.rand(4, 6, generator=g)
    noise = 1e-4 * torch.randn(4, 6, generator=g)
    ok = check_rollout_serves_adapter(guard_batch(policy + noise, policy, base), staleness=0)
    assert ok["lora/adapter_check"] == 1.0 and ok["lora/rollout_vs_policy"] < ok["lora/rollout_vs_base"]
    with pytest.raises(AdapterNotServedError, match="base model without the adapter"):
        check_rollout_serves_adapter(guard_batch(base + noise, policy, base), staleness=0)
    # not judged: version 0 (peft's B = 0), a stale batch from a young adapter, no separation
    assert check_rollout_serves_adapter(guard_batch(base + noise, policy, base, 0), 0)["lora/adapter_check"] == 0
    assert check_rollout_serves_adapter(guard_batch(base + noise, policy, base, 1), 1)["lora/adapter_check"] == 0
    same = check_rollout_serves_adapter(guard_batch(base + noise, base, base), 0)
    assert same["lora/adapter_check"] == 0 and same["lora/policy_vs_base"] == 0


def test_guard_catches_an_engine_that_ignores_the_adapter(base_dir):
    """A real hf engine whose adapter syncs never arrive: the trainer's policy (non-zero adapter)
    scores its samples; the guard sees the rollout is the base model and stops the run."""
    trainer = lora_model(base_dir).eval()
    engine = adapter_engine(base_dir)  # base weights, peft's initial adapter (B = 0): no effect
    batch = engine.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=1))
    batch["old_logprobs"] = reference_logprobs(trainer, batch)
    with trainer.disable_adapter():
        batch["ref_logprobs"] = reference_logprobs(trainer, batch)
    batch["weight_version"] = torch.full((len(batch),), 3)
    with pytest.raises(AdapterNotServedError):
        check_rollout_serves_adapter(batch, staleness=0)
    # once the adapter arrives, the same check passes
    sync_from_thread(
        list(adapter_weights(trainer)), engine.adapter_manifest(), engine.load_adapter, engine.loaded_adapter_tensor, 3
    )
    batch = engine.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=1))
    batch["old_logprobs"] = reference_logprobs(trainer, batch)
    with trainer.disable_adapter():
        batch["ref_logprobs"] = reference_logprobs(trainer, batch)
    batch["weight_version"] = torch.full((len(batch),), 3)
    assert check_rollout_serves_adapter(batch, staleness=0)["lora/adapter_check"] == 1.0


def test_apply_lora_config_matches_the_rollout(base_dir):
    """The rollout wraps its model with the same LoraConfig: same adapted modules as the trainer."""
    cfg = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"])
    engine = HFRolloutEngine(base_dir, "float32", "cpu", 0, 1, batch_size=4, lora=cfg)
    trainer = apply_lora(load_causal_lm(base_dir, "float32"), cfg)
    assert engine.adapter_manifest() == manifest_of(adapter_weights(trainer))
    assert {n.split(".")[-3] for n, _ in adapter_weights(trainer)} == {"q_proj", "v_proj"}


def test_a_sync_of_the_wrong_kind_is_refused_on_both_sides(base_dir):
    """A merged sync sent to a rollout that serves an adapter (it would apply the adapter twice):
    the rollout refuses inside the protocol, so the sender stops with an error instead of waiting."""
    from rlpost.config import load_config
    from rlpost.rollout.worker import RolloutWorker
    from rlpost.weightsync.manifest import WeightSyncError

    cfg = load_config(
        [
            "+recipe=quickstart",
            f"model.path={base_dir}",
            "model.lora.rank=4",
            "model.lora.alpha=8",
            "model.lora.mode=adapter",
        ]
    )
    worker = RolloutWorker(cfg, base_dir, 0, 0, 1)
    trainer = lora_model(base_dir)
    named = list(base_weights(trainer, torch.float32))
    port, errors = free_port(), {}

    def sender():
        group = SyncGroup("127.0.0.1", port, 0, 2, "cpu", 60)
        try:
            send_weights(group, manifest_of(named), iter([t for _, t in named]), 0, 4096)
        except WeightSyncError as e:
            errors["sender"] = str(e)

    thread = threading.Thread(target=sender)
    thread.start()
    worker.init_weight_sync([("127.0.0.1", port, 1, 2)], "broadcast")
    with pytest.raises(WeightSyncError, match="a 'merged' sync reached a rollout that takes"):
        worker.receive_weights(0, "merged")
    thread.join(timeout=30)
    assert "rank 1 refused the header" in errors["sender"]
