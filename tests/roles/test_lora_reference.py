"""The LoRA actor's reference is the base model with its adapters skipped (`adapters_off`). In
mixed precision FSDP2 fixes a unit's gradient dtypes at its first forward from the parameters
that require grad then; peft's `disable_adapter` sets the adapters' `requires_grad` to False, so
when the first forward of an actor was the reference's (the adapter check at the first step of a
resumed run, found on an H200) the adapters' gradients stayed bfloat16 against float32 masters
and the backward failed. Here an actor whose first forward is the reference trains exactly as one
whose first forward is the policy's."""

import torch

from rlpost.data.batch import Batch
from rlpost.trainer.lora import adapters_off
from rlpost.weightsync.transport import free_port
from tests.actor_batches import LORA, config, shards_for
from tests.helpers import save_tiny_model


def shard_without_old(model, cfg) -> Batch:
    """A shard that trains in one step on the update's own log-probs (the fused pass)."""
    shard = shards_for(model, cfg)[0]
    del shard.tensors["old_logprobs"]
    return shard


def trained(tmp_path, base: bool) -> tuple[dict[str, torch.Tensor], Batch]:
    from rlpost.roles.actor import ActorWorker
    from rlpost.trainer.fsdp import full_tensor

    model, _ = save_tiny_model(tmp_path / "model")
    cfg = config("model.dtype=bfloat16", "model.lora.mode=merge", *LORA)
    worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    try:
        _, logprobs = worker.update(shard_without_old(model, cfg), base=base)
        params = {n: full_tensor(p.detach()).clone() for n, p in worker.model.named_parameters()}
    finally:
        worker.shutdown()
    return params, logprobs


def test_an_actor_whose_first_forward_is_the_reference_trains_as_one_whose_is_not(tmp_path):
    with_base, logprobs = trained(tmp_path / "a", base=True)
    without, plain = trained(tmp_path / "b", base=False)
    assert with_base.keys() == without.keys()
    for name in with_base:
        assert torch.equal(with_base[name], without[name]), name
    assert any(".lora_" in n and not torch.equal(with_base[n], 0 * with_base[n]) for n in with_base)
    # B is 0 before the first step: the base model's log-probs are the policy's
    torch.testing.assert_close(logprobs["ref_logprobs"], plain["old_logprobs"], rtol=0, atol=1e-5)


def test_adapters_off_skips_the_adapters_and_leaves_them_trainable(tmp_path):
    from peft import LoraConfig, get_peft_model

    model, _ = save_tiny_model(tmp_path / "model")
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)  # the adapter changes the output
    ids = torch.arange(1, 9)[None]
    with torch.no_grad():
        adapted = peft_model(ids).logits
        with peft_model.disable_adapter():
            reference = peft_model(ids).logits
        with adapters_off(peft_model):
            assert all(p.requires_grad for n, p in peft_model.named_parameters() if ".lora_" in n)
            off = peft_model(ids).logits
        again = peft_model(ids).logits
    assert not torch.equal(adapted, reference)
    assert torch.equal(off, reference)
    assert torch.equal(again, adapted)  # on again when the context ends


def test_a_kl_reference_is_stored_in_the_compute_dtype_and_scores_as_the_policy_before_a_step(tmp_path):
    """The reference of a KL keeps its parameters in the compute dtype (bfloat16 here: half the
    memory of a float32 copy; at 7B on one GPU 14 GiB of an update that did not fit) and computes
    with exactly the values mixed precision gives the float32 policy: before any step the two
    score every token alike. Its buffers (the rotary frequencies) are not cast."""
    from rlpost.roles.actor import ActorWorker

    model, _ = save_tiny_model(tmp_path / "model")
    cfg = config("model.dtype=bfloat16", "algo.kl_coef=0.1")
    worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    try:
        assert {p.dtype for p in worker.ref_model.parameters()} == {torch.bfloat16}
        assert {p.dtype for p in worker.model.parameters()} == {torch.float32}
        assert {b.dtype for b in worker.ref_model.buffers()} == {b.dtype for b in worker.model.buffers()}
        out = worker.compute_logprobs(shards_for(model, cfg)[0])
    finally:
        worker.shutdown()
    assert torch.equal(out["ref_logprobs"], out["old_logprobs"])
