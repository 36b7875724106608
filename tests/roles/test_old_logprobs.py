"""The old log-probs from the update's own forward (`algo.old_logprobs=auto` with one optimizer step
per batch) against a separate pass: the same weights, Adam states, metrics and returned log-probs,
bit for bit, with every term that reads them (KL to a reference model, TIS, entropy) switched on,
and with LoRA (the base model's log-probs for the adapter check). A shard without old log-probs
that would take several optimizer steps is refused."""

import pytest
import torch

from rlpost.config import load_config
from rlpost.controller.step import old_logprobs_in_update
from rlpost.data.batch import Batch
from rlpost.weightsync.transport import free_port
from tests.helpers import ragged_generation, reference_logprobs, save_tiny_model

COMMON = [
    "+recipe=quickstart",
    "trainer.world_size=1",
    "data.train_batch_size=4",
    "rollout.n=2",
    "trainer.micro_batch_size=3",  # three micro-batches of unequal size
    "trainer.optim.lr=1e-2",
    "rollout.temperature=0.8",
    "algo.entropy_coef=0.05",
    "algo.rollout_is=token",
    "algo.rollout_is_threshold=1.2",
]
LORA = ["model.lora.rank=4", "model.lora.alpha=8"]
CASES = {  # (overrides, whether the controller asks for the base model's log-probs)
    "no_reference": (["algo.kl_coef=0"], False),
    "reference_model": (["algo.kl_coef=0.3", "algo.kl_estimator=k2"], False),
    "lora": (["algo.kl_coef=0.3", *LORA], True),
    "lora_no_kl": (["algo.kl_coef=0", *LORA], True),
    "lora_no_kl_no_probe": (["algo.kl_coef=0", *LORA], False),
}


def generation(model, seed: int = 0, multi_turn: bool = False) -> Batch:
    """8 ragged rows as the rollouts deliver them: no old or reference log-probs yet."""
    batch, g = ragged_generation(seed, multi_turn=multi_turn)
    noise = (torch.rand(batch["response_ids"].shape, generator=g) - 0.5) * batch["response_mask"]
    batch["rollout_logprobs"] = reference_logprobs(model, batch, 0.8) + noise  # TIS bites both ways
    batch["advantages"] = torch.randn(8, generator=g)
    return batch


def trained(cfg, model_dir, shards, separate: bool, base: bool):
    """(metrics, log-probs, parameters, Adam states) after the last of the updates of a fresh
    actor on `shards`, one each (after the first, the policy is no longer the reference)."""
    from rlpost.roles.actor import ActorWorker
    from rlpost.trainer.fsdp import full_tensor

    worker = ActorWorker(cfg, model_dir, 0, 1, "127.0.0.1", free_port())
    try:
        torch.manual_seed(0)
        for shard in shards:
            if separate:
                logprobs = worker.compute_logprobs(shard, base) if base else worker.compute_logprobs(shard)
                order = torch.argsort(logprobs["row_index"])
                for key in ("old_logprobs", "ref_logprobs"):
                    if key in logprobs:
                        shard[key] = logprobs[key][order]
                metrics, returned = worker.update(shard, base) if base else worker.update(shard)
                assert len(returned) == 0  # nothing to return: the shard brought its log-probs
            else:
                metrics, logprobs = worker.update(shard, base) if base else worker.update(shard)
        params = {n: full_tensor(p.detach()).clone() for n, p in worker.model.named_parameters()}
        states = [{k: full_tensor(v).clone() for k, v in s.items()} for s in worker.optimizer.state.values()]
        return metrics, logprobs, params, states
    finally:
        worker.shutdown()


@pytest.mark.parametrize("case", list(CASES))
def test_old_logprobs_from_the_update_equal_a_separate_pass(tmp_path, case):
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch

    overrides, base = CASES[case]
    model, _ = save_tiny_model(tmp_path / "model")
    cfg = load_config(COMMON + overrides)
    assert old_logprobs_in_update(cfg)
    assert not old_logprobs_in_update(load_config(COMMON + overrides + ["algo.old_logprobs=separate"]))
    batches = [generation(model, seed) for seed in (0, 1)]
    shards = [shard_batch(b, step_plan(b, cfg)[1])[0] for b in batches]
    assert len(set(shards[0]["micro_batch_ids"].tolist())) == 3
    m_sep, lp_sep, p_sep, s_sep = trained(
        cfg, str(tmp_path / "model"), [s.select(slice(None)) for s in shards], True, base
    )
    m_upd, lp_upd, p_upd, s_upd = trained(
        cfg, str(tmp_path / "model"), [s.select(slice(None)) for s in shards], False, base
    )

    with_ref = base or "algo.kl_coef=0.3" in overrides  # a reference, or the adapter check's base
    expected = {"old_logprobs", "row_index"} | ({"ref_logprobs"} if with_ref else set())
    assert set(lp_upd.keys()) == set(lp_sep.keys()) == expected
    for key in lp_sep.keys():
        assert torch.equal(lp_upd[key], lp_sep[key]), key
    for name, p in p_sep.items():
        assert torch.equal(p_upd[name], p), name
    assert m_upd["actor/grad_norm"] > 0  # the update moved the weights: both paths are one update
    assert len(s_upd) == len(s_sep) > 0
    for a, b in zip(s_upd, s_sep):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    timing = {k for k in m_sep if k.startswith("timing_s/")}
    assert {k: v for k, v in m_upd.items() if k not in timing} == {k: v for k, v in m_sep.items() if k not in timing}
    assert m_upd["actor/first_ratio_dev"] == 0.0 and m_upd["rollout_corr/truncated_frac"] > 0
    if "algo.kl_coef=0.3" in overrides:  # the second update's policy has moved off the reference
        assert m_upd["actor/kl"] > 0


def test_a_shard_without_old_logprobs_must_train_in_one_step(tmp_path):
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.roles.actor import ActorWorker

    model, _ = save_tiny_model(tmp_path / "model")
    for extra in (["algo.ppo_epochs=2"], ["algo.ppo_mini_batch_size=2"]):
        cfg = load_config(COMMON + ["algo.kl_coef=0"] + extra)
        assert not old_logprobs_in_update(cfg)
        batch = generation(model)
        shard = shard_batch(batch, step_plan(batch, cfg)[1])[0]
        worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
        try:
            with pytest.raises(ValueError, match=r"^a shard without old_logprobs must train in one optimizer step"):
                worker.update(shard)
        finally:
            worker.shutdown()


@pytest.mark.parametrize("multi_turn", [False, True], ids=["single_turn", "multi_turn"])
def test_two_mini_batches_first_ratio_lr_and_timing(tmp_path, multi_turn):
    """A separate pass, then two optimizer steps: the first step's ratios are exactly 1 (also on
    multi-turn rows, whose environment tokens get no loss), the second mini-batch's moved (so
    `first_ratio_dev` looks at the first step only); the reported lr is the schedule's and the
    worker's time lies within the call's."""
    import time

    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch, split_shard
    from rlpost.roles.actor import ActorWorker

    model, _ = save_tiny_model(tmp_path / "model")
    common = [o for o in COMMON if not o.startswith("algo.rollout_is_threshold=")]  # (no correction: no cap)
    cfg = load_config(common + ["algo.kl_coef=0", "algo.ppo_mini_batch_size=2", "algo.rollout_is=none"])
    batch = generation(model, multi_turn=multi_turn)
    assert multi_turn == bool((batch["response_mask"] & ~batch["loss_mask"]).any())
    shard = shard_batch(batch, step_plan(batch, cfg)[1])[0]
    assert len(set(shard["mini_batch_ids"].tolist())) == 2
    worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    try:
        logprobs = worker.compute_logprobs(shard)
        shard["old_logprobs"] = logprobs["old_logprobs"]  # in the shard's own order
        assert torch.equal(logprobs["row_index"], shard["row_index"])
        start = time.perf_counter()
        metrics, returned = worker.update(shard)
        wall = time.perf_counter() - start
        assert len(returned) == 0
        assert metrics["actor/first_ratio_dev"] == 0.0
        assert metrics["actor/ppo_ratio_max"] > 1 + 1e-4 or metrics["actor/ppo_ratio_min"] < 1 - 1e-4
        assert metrics["actor/lr"] == worker.engine.scheduler.get_last_lr()[0] > 0
        assert 0 < metrics["timing_s/update_worker"] <= wall
        micro = [mb for mini in split_shard(shard) for mb in mini]
        widest = max(len(mb) * int(mb["prompt_mask"].sum(-1).max() + mb["response_mask"].sum(-1).max()) for mb in micro)
        assert metrics["perf/microbatch_tokens"] == widest  # what the memory plan sizes a micro-batch by
    finally:
        worker.shutdown()


@pytest.mark.parametrize(
    "overrides, reference", [([], False), (["algo.kl_coef=0.1"], True), (["algo.kl_coef=0.1", *LORA], False)]
)
def test_a_reference_copy_exists_only_for_a_kl_without_lora(tmp_path, overrides, reference):
    """The reference role: a frozen copy with a KL, none without one, none with LoRA (the base
    is the policy with its adapters off)."""
    from rlpost.roles.actor import ActorWorker

    save_tiny_model(tmp_path / "model")
    cfg = load_config(COMMON + ["algo.kl_coef=0", *overrides])
    worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    try:
        assert (worker.ref_model is not None) == reference
        assert worker.engine.frozen == ([worker.ref_model] if reference else [])
    finally:
        worker.shutdown()


def test_the_reference_comes_to_the_device_only_in_the_phases_that_score_with_it(tmp_path, monkeypatch):
    """`trainer.param_offload`: a phase brings the models it computes with. The reference scores in
    `compute_logprobs` and in an update that makes its own old log-probs, not in an update of a
    shard that brought them (its 14 GiB at 7B are more than that update has to spare)."""
    from rlpost.roles.actor import ActorWorker
    from tests.actor_batches import config, shards_for

    model, _ = save_tiny_model(tmp_path / "model")
    cfg = config("algo.kl_coef=0.1", "trainer.param_offload=true")
    worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    brought = []
    resident = worker.engine.resident
    monkeypatch.setattr(worker.engine, "resident", lambda *m, **k: brought.append(m) or resident(*m, **k))
    try:
        shard = shards_for(model, cfg)[0]
        scored = worker.compute_logprobs(shard)
        shard["ref_logprobs"] = shard["old_logprobs"].clone()  # as the controller adds the scored ones
        worker.update(shard)
        fused = Batch({k: v for k, v in shard.tensors.items() if k not in ("old_logprobs", "ref_logprobs")})
        worker.update(fused)
    finally:
        worker.shutdown()
    assert "ref_logprobs" in scored
    policy, ref = worker.model, worker.ref_model
    both, alone = [id(policy), id(ref)], [id(policy)]
    assert [[id(m) for m in models] for models in brought] == [both, alone, both]
