"""Each algorithm's recipe through the real controller (Ray, 2 gloo trainer ranks, 1 hf rollout
actor): two steps, the first PPO ratio exactly 1 (and ratios away from 1 in the later mini-batches of
the recipes that take several optimizer steps a batch), every sync verified with the next version,
and the metrics the algorithm's parts add. Every algorithm without a critic trains on multi-turn
episodes (`env.name=retry`: the environment's "try again" tokens get no loss); PPO on single turns."""

import json

import pytest

from rlpost.config import load_config
from rlpost.controller.run import train

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # 7 runs, 90 s together: CI runs them

# per recipe: metrics its parts must add; whether the log-probs need a pass of their own
ALGORITHMS = {
    "ppo": (["critic/vf_loss", "critic/grad_norm", "kl/coef", "timing_s/values", "timing_s/critic_update"], True),
    "rloo": ([], False),
    "reinforce_pp": (["timing_s/logprob"], True),  # the KL in the reward needs them first
    "reinforce_pp_baseline": (["actor/kl"], False),
    "dapo": (["filter/rounds", "filter/dropped_groups", "filter/filled_groups", "timing_s/filter"], False),
    "gspo": ([], False),
    "cispo": (["actor/kl"], False),
}


@pytest.mark.parametrize("recipe", sorted(ALGORITHMS))
def test_each_algorithm_trains_through_the_controller(ray_session, base_overrides, tmp_path, recipe):
    extra, separate_pass = ALGORITHMS[recipe]
    run_dir = tmp_path / "run"
    overrides = [f"+recipe={recipe}" if o == "+recipe=quickstart" else o for o in base_overrides(run_dir)]
    warmup = 1 if recipe == "ppo" else 0  # PPO: the first step trains the critic only
    episodes = [] if recipe == "ppo" else ["env.name=retry", "env.max_turns=2", "rollout.max_response_length=48"]
    recipe_cfg = load_config([f"+recipe={recipe}"])  # its optimizer steps a batch, kept at the test's batch size
    steps_per_batch = min(recipe_cfg.data.train_batch_size // (recipe_cfg.algo.ppo_mini_batch_size or 10**9) or 1, 4)
    mini = [f"algo.ppo_mini_batch_size={8 // steps_per_batch}"] if steps_per_batch > 1 else []
    cfg = load_config(
        overrides
        + ["trainer.total_steps=2", "trainer.val_every=0", f"critic.warmup_steps={warmup}", *episodes, *mini]
        + ["algo.entropy_coef=0.01"]  # a gradient though every group's rewards tie: the ratios below are checked
    )
    assert cfg.algo.name == recipe and cfg.data.train_batch_size == 8
    train(cfg)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    # every step ends in a verified sync: of the next version, or of the same one in the warm-up
    assert [r["weight_sync/version"] for r in steps] == [1 - warmup, 2 - warmup]
    assert [r["rollout/weight_version"] for r in steps] == [0, 1 - warmup]
    for r in steps[warmup:]:
        missing = [k for k in ["actor/pg_loss", "actor/grad_norm", "reward/shaped_mean", *extra] if k not in r]
        assert not missing, f"{recipe}: metrics missing {missing}"
        if separate_pass or steps_per_batch > 1:  # (from the update's own forward it is 1 by construction)
            assert r["actor/first_ratio_dev"] <= 1e-5, recipe  # on-policy: the first ratio is 1
        assert r["rollout/logprob_diff_max"] <= 1e-4, recipe
        assert ("timing_s/logprob" in r) == (separate_pass or steps_per_batch > 1), recipe
        if episodes:  # some answers are wrong: their episodes take a second turn after "try again"
            assert 1 < r["env/turns_mean"] <= 2 and 0 < r["env/model_token_frac"] < 1, recipe
    if steps_per_batch > 1:  # the optimizer steps once a mini-batch (the warm-up's lr counts them) and
        o = cfg.trainer.optim  # the later mini-batches train off the policy that generated: ratios move
        assert steps[warmup]["actor/lr"] == pytest.approx(o.lr * (steps_per_batch + 1) / o.warmup_steps), recipe
        trained = [r for r in steps[warmup:] if r["actor/grad_norm"] > 1e-6]
        assert trained, recipe
        assert all(max(r["actor/ppo_ratio_max"] - 1, 1 - r["actor/ppo_ratio_min"]) > 1e-4 for r in trained), recipe
    if warmup:
        assert "actor/pg_loss" not in steps[0] and "critic/vf_loss" in steps[0]
    if recipe == "dapo":  # the batch still holds train_batch_size prompts after filtering
        assert all(r["filter/rounds"] <= cfg.algo.max_filter_rounds for r in steps)
