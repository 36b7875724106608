"""The reward of each token (rlpost.controller.step): where a sample's reward lands, the KL
penalty in the reward (fixed and adaptive coefficient), DAPO's overlong shaping and filter, and the
dynamic-sampling fill of a batch with groups that pass (rlpost.controller.rollouts)."""

import torch

from rlpost.config import load_config
from rlpost.data.batch import Batch
from tests.helpers import metrics_batch


def test_token_rewards_put_the_reward_last_and_the_kl_on_every_loss_token():
    from rlpost.controller.step import advantages, token_rewards

    batch = metrics_batch()
    batch["rewards"] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    batch["ref_logprobs"] = batch["old_logprobs"] - torch.tensor([[0.5], [1.0], [-0.5], [2.0]])
    # group estimators see no per-token rewards and no KL: the KL stays in the loss
    assert token_rewards(batch, load_config(["+recipe=quickstart", "algo.kl_coef=0.5"])).tolist() == [
        [0.0, 0.0, 1.0],  # the last loss token (the middle one is a hole)
        [2.0, 0.0, 0.0],
        [0.0, 3.0, 0.0],
        [0.0, 0.0, 0.0],  # no loss token: the reward goes nowhere
    ]
    cfg = load_config(["+recipe=quickstart", "algo.name=reinforce_pp", "algo.kl_coef=0.5", "algo.kl_estimator=k1"])
    kl = torch.tensor([0.5, 1.0, -0.5, 2.0])[:, None] * batch["loss_mask"]
    expected = torch.tensor([[0.0, 0.0, 1.0], [2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 0.0]]) - 0.5 * kl
    assert torch.allclose(token_rewards(batch, cfg), expected)
    # and they are what REINFORCE++ turns into advantages: only the estimator sees them
    adv = advantages(batch, cfg)
    assert "token_rewards" not in batch and adv.shape == batch["loss_mask"].shape
    assert (adv[~batch["loss_mask"]] == 0).all() and adv[batch["loss_mask"]].abs().sum() > 0


def test_dapo_overlong_shaping_and_filtering():
    from rlpost.controller.step import filter_overlong, shape_rewards

    batch = metrics_batch()  # response lengths 3, 1, 2, 2; eos id 1
    cfg = load_config(
        ["+recipe=quickstart", "rollout.max_response_length=3", "algo.overlong_buffer=2", "algo.overlong_penalty=0.5"]
    )
    shaped = shape_rewards(batch, torch.ones(4), cfg)
    assert shaped.tolist() == [0.5, 1.0, 0.75, 0.75]  # free up to 1 token, then -0.5 * (l - 1) / 2
    assert filter_overlong(batch, cfg, eos_id=1) == 0  # row 0 reached 3 tokens but ends in EOS
    batch["response_ids"][0, 2] = 4
    kept = batch["loss_mask"].clone()
    assert filter_overlong(batch, cfg, eos_id=1) == 1 and torch.equal(batch["loss_mask"], kept)  # counted only
    on = load_config(["+recipe=quickstart", "rollout.max_response_length=3", "algo.overlong_filter=true"])
    assert filter_overlong(batch, on, eos_id=1) == 1
    assert not batch["loss_mask"][0].any() and torch.equal(batch["loss_mask"][1:], kept[1:])


def test_fill_keeps_passing_groups_in_order_and_fills_past_the_cap():
    from rlpost.controller.rollouts import Scored, _fill
    from rlpost.data.padding import left_pad, right_pad

    n = 2

    def part(tag, widths):
        """A round of len(widths) groups: response j of group g has widths[g] tokens."""
        rows = [f"{tag}{g}" for g in range(len(widths))]
        prompt_ids, prompt_mask = left_pad([[9] * (1 + g) for g in range(len(widths)) for _ in range(n)], 0)
        response_ids, response_mask = right_pad([[5] * w for w in widths for _ in range(n)], 0)
        batch = Batch(
            {
                "prompt_ids": prompt_ids,
                "prompt_mask": prompt_mask,
                "response_ids": response_ids,
                "response_mask": response_mask,
                "weight_version": torch.arange(len(rows) * n),
            }
        )
        scores = torch.arange(len(rows) * n, dtype=torch.float32)
        return Scored(rows, batch, scores, {"errors": 1, "timeouts": 1}, [f"{tag}{i}" for i in range(len(rows) * n)])

    rounds = [part("a", [1, 2, 3]), part("b", [4, 1, 2])]
    keeps = [torch.tensor([False, True, False]), torch.tensor([True, False, True])]
    out = _fill(rounds, keeps, wanted=3, n=n, pad_id=0)  # enough passed: a1, b0, b2
    assert out.rows == ["a1", "b0", "b2"] and out.responses == ["a2", "a3", "b0", "b1", "b4", "b5"]
    assert out.scores.tolist() == [2.0, 3.0, 0.0, 1.0, 4.0, 5.0] and out.errors == {"errors": 2, "timeouts": 2}
    assert out.batch["group_ids"].tolist() == [0, 0, 1, 1, 2, 2]
    assert out.batch["response_mask"].sum(-1).tolist() == [2, 2, 4, 4, 2, 2]  # rows travel whole, re-padded
    assert out.batch["response_ids"].shape[1] == 4 and out.batch["weight_version"].tolist() == [2, 3, 0, 1, 4, 5]
    assert out.metrics["filter/rounds"] == 1 and out.metrics["filter/filled_groups"] == 0
    assert out.metrics["filter/dropped_groups"] == 3 and out.metrics["filter/kept_groups_first_round"] == 1
    # the cap was reached with two passing groups: one dropped group (the earliest) fills the batch
    out = _fill(rounds[:1], keeps[:1] + [], wanted=2, n=n, pad_id=0)
    assert out.rows == ["a0", "a1"] and out.metrics["filter/filled_groups"] == 1
    # more passing groups than wanted: the first ones
    out = _fill(rounds, [torch.ones(3, dtype=torch.bool)] * 2, wanted=2, n=n, pad_id=0)
    assert out.rows == ["a0", "a1"] and out.metrics["filter/dropped_groups"] == 0


def test_the_kl_is_in_the_reward_only_with_a_coefficient():
    from rlpost.controller.step import kl_in_reward, old_logprobs_in_update, token_rewards

    on = load_config(["+recipe=reinforce_pp", "algo.kl_coef=0.01"])
    off = load_config(["+recipe=reinforce_pp", "algo.kl_coef=0"])
    assert kl_in_reward(on) and not old_logprobs_in_update(on)  # the advantages need the log-probs first
    assert not kl_in_reward(off) and old_logprobs_in_update(off)  # nothing needs them before the update
    assert not kl_in_reward(load_config(["+recipe=quickstart", "algo.kl_coef=0.01"]))  # GRPO: in the loss
    batch = metrics_batch()  # no reference log-probs: none are needed without a KL
    batch["rewards"] = torch.ones(4)
    assert token_rewards(batch, off).sum() == 3.0


def test_an_adaptive_kl_coefficient_replaces_the_configured_one():
    from rlpost.controller.step import advantages, token_rewards

    batch = metrics_batch()
    batch["rewards"] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    batch["ref_logprobs"] = batch["old_logprobs"] - 0.5
    cfg = load_config(["+recipe=quickstart", "algo.name=reinforce_pp", "algo.kl_coef=0.5", "algo.kl_estimator=k1"])
    base = token_rewards(batch, cfg, 0.0)
    assert torch.allclose(token_rewards(batch, cfg, 2.0), base - 2.0 * 0.5 * batch["loss_mask"])
    assert torch.allclose(token_rewards(batch, cfg), base - 0.5 * 0.5 * batch["loss_mask"])
    assert not torch.allclose(advantages(batch, cfg, 2.0), advantages(batch, cfg))
