"""The pure parts of a training step (rlpost.controller.step): the batch's metrics, the staleness
guard, the padding a plan would compute, the sampling settings and the LoRA adapter guard."""

import math
import re

import pytest
import torch

from rlpost.config import load_config
from rlpost.controller.step import (
    AdapterNotServedError,
    batch_metrics,
    check_rollout_serves_adapter,
    check_staleness,
    env_metrics,
    plan_padding_fraction,
    sampling_params,
)
from rlpost.data.batch import Batch
from rlpost.rollout.base import SamplingParams


# ----------------------------------------------------------------------------------- batch_metrics
def metrics_batch() -> Batch:
    """4 rows (2 prompts x n=2), loss masks with holes where the log-probs disagree wildly."""
    return Batch(
        {
            "prompt_ids": torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]]),
            "prompt_mask": torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]], dtype=torch.bool),
            "response_ids": torch.tensor([[4, 4, 1], [1, 0, 0], [4, 1, 0], [4, 1, 0]]),
            "response_mask": torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool),
            "loss_mask": torch.tensor([[1, 0, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool),
            "rollout_logprobs": torch.tensor(
                [[-1.0, -9.0, -0.5], [-2.0, 0.0, 0.0], [-0.25, -1.0, 0.0], [-3.0, -3.0, 0.0]]
            ),
            "old_logprobs": torch.tensor(
                [[-1.5, -1.0, -0.5], [-1.0, 0.0, 0.0], [-0.5, -1.125, 0.0], [-9.0, -8.0, 0.0]]
            ),
            "weight_version": torch.tensor([2, 2, 3, 3]),
        }
    )


def test_batch_metrics_hand_computed():
    """Every metric of a 4-row batch against its value by hand; log-prob gaps only on loss tokens."""
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    m = batch_metrics(metrics_batch(), rewards, reward_errors={"errors": 3, "timeouts": 1}, n=2)
    # loss tokens: |diff| 0.5, 0.0, 1.0, 0.25, 0.125 (the holes' 8.0, 6.0, 5.0 are left out)
    assert m == {
        "reward/mean": 0.5,
        "reward/std": pytest.approx(math.sqrt((0.25 + 0.25) / 3), rel=1e-6),
        "reward/errors": 3.0,
        "reward/timeouts": 1.0,
        "reward/uniform_groups": 0.5,  # group [1, 0] differs, group [0.5, 0.5] is uniform
        "response_length/mean": 2.0,  # lengths 3, 1, 2, 2
        "response_length/max": 3.0,
        "rollout/logprob_diff_max": 1.0,
        "rollout/logprob_diff_mean": pytest.approx(1.875 / 5, rel=1e-6),
        "rollout/weight_version": 2.5,
        "perf/tokens": 18.0,  # 2 + 2 + 3 + 3 prompt tokens, 3 + 1 + 2 + 2 response tokens
    }
    assert all(type(v) is float for v in m.values())


def test_batch_metrics_of_multi_turn_episodes_hand_computed():
    """Episodes add the env/* metrics: turns and tool calls per episode, failed calls and
    timeouts in all, the environment's rewards, the share of response tokens that are the model's."""
    batch = metrics_batch()
    batch["env_turns"] = torch.tensor([1.0, 2.0, 3.0, 2.0])
    batch["env_tool_calls"] = torch.tensor([0.0, 1.0, 3.0, 0.0])
    batch["env_tool_errors"] = torch.tensor([0.0, 1.0, 2.0, 0.0])
    batch["env_timeouts"] = torch.tensor([0.0, 0.0, 1.0, 1.0])
    batch["env_reward"] = torch.tensor([0.5, 0.0, -1.0, 0.0])
    m = batch_metrics(batch, torch.tensor([1.0, 0.0, 0.5, 0.5]), reward_errors={}, n=2)
    assert {k: v for k, v in m.items() if k.startswith("env/")} == {
        "env/turns_mean": 2.0,
        "env/tool_calls_mean": 1.0,
        "env/tool_errors": 3.0,
        "env/timeouts": 2.0,
        "env/reward_mean": -0.125,
        "env/model_token_frac": 5 / 8,  # loss tokens 2 + 1 + 2 + 0 of response tokens 3 + 1 + 2 + 2
    }
    assert not any(k.startswith("env/") for k in batch_metrics(metrics_batch(), torch.ones(4), {}, 2))
    # one response token, the model's: the share is 1 (the guard against 0 tokens does not bite)
    one = batch.select([1])
    assert env_metrics(one)["env/model_token_frac"] == 1.0
    one["loss_mask"] = torch.zeros_like(one["loss_mask"])
    one["response_mask"] = torch.zeros_like(one["response_mask"])
    assert env_metrics(one)["env/model_token_frac"] == 0.0  # no response token at all


def test_batch_metrics_of_one_row_without_loss_tokens():
    """One row: std 0 (not NaN); no loss token: log-prob gaps 0 (not NaN or an error)."""
    b = metrics_batch().select([3])
    m = batch_metrics(b, torch.tensor([0.75]), reward_errors={"errors": 0}, n=1)
    assert m["reward/std"] == 0.0 and m["reward/mean"] == 0.75 and m["reward/uniform_groups"] == 1.0
    assert m["rollout/logprob_diff_max"] == 0.0 and m["rollout/logprob_diff_mean"] == 0.0
    assert m["response_length/mean"] == 2.0 and m["rollout/weight_version"] == 3.0 and m["perf/tokens"] == 5.0


def test_batch_metrics_groups_follow_n():
    """`n` cuts the rewards into contiguous groups: n=2 and n=4 see different uniform groups."""
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert batch_metrics(metrics_batch(), rewards, {}, n=2)["reward/uniform_groups"] == 1.0
    assert batch_metrics(metrics_batch(), rewards, {}, n=4)["reward/uniform_groups"] == 0.0
    assert batch_metrics(metrics_batch(), rewards, {}, n=1)["reward/uniform_groups"] == 1.0


def test_batch_metrics_std_of_two_rows_is_unbiased():
    """Two rows already have a std: the unbiased one, sqrt(((1 - 0.5)^2 + (0 - 0.5)^2) / 1)."""
    m = batch_metrics(metrics_batch().select([0, 1]), torch.tensor([1.0, 0.0]), {}, n=2)
    assert m["reward/std"] == pytest.approx(math.sqrt(0.5), rel=1e-6)


# -------------------------------------------------------------------------------- check_staleness
def test_check_staleness_counts_from_the_oldest_row():
    """Staleness is trainer version minus the oldest generator's version; up to `allowed` passes."""
    b = Batch({"weight_version": torch.tensor([4, 2, 3])})
    assert check_staleness(b, version=4, allowed=2) == 2
    assert check_staleness(b, version=2, allowed=0) == 0
    assert check_staleness(b, version=3, allowed=5) == 1


def test_check_staleness_refuses_a_batch_too_far_behind():
    """One version more than allowed raises, naming both versions and the bound."""
    b = Batch({"weight_version": torch.tensor([4, 2, 3])})
    msg = (
        "a batch generated by weight version 2 would train version 4 "
        "(at most 1 behind: algo.max_staleness with split placement, 0 otherwise)"
    )
    with pytest.raises(RuntimeError, match="^" + re.escape(msg) + "$"):
        check_staleness(b, version=4, allowed=1)
    with pytest.raises(RuntimeError, match=r"weight version 2 would train version 3 \(at most 0 behind"):
        check_staleness(b, version=3, allowed=0)


# -------------------------------------------------------------------------- plan_padding_fraction
def test_plan_padding_fraction_is_the_mean_over_mini_batches():
    """plan[rank][mini][micro]: each mini-batch's padding share over all ranks, then their mean
    (3 ranks, 2 mini-batches, so a mean over ranks would differ)."""
    lengths = [4, 2, 3, 3, 1, 5, 6, 2]
    plan = [
        [[[0, 1]], [[4, 5]]],  # rank 0: mini 0 pads 2 to 4; mini 1 pads 1 to 5
        [[[2]], [[3]]],  # ranks 1 and 2: single rows, no padding
        [[[6]], [[7]]],
    ]
    # mini 0: real 4 + 2 + 3 + 6 = 15 of 2 * 4 + 3 + 6 = 17; mini 1: real 1 + 5 + 3 + 2 = 11 of 2 * 5 + 3 + 2 = 15
    expected = ((1 - 15 / 17) + (1 - 11 / 15)) / 2
    assert plan_padding_fraction(lengths, plan) == pytest.approx(expected, rel=1e-12)
    assert plan_padding_fraction(lengths, [[[[0], [1]], [[4], [5]]], [[[2]], [[3]]]]) == 0.0
    assert plan_padding_fraction([2, 6], [[[[0, 1]]]]) == pytest.approx(1 - 8 / 12, rel=1e-12)


# -------------------------------------------------------------------------------- sampling_params
@pytest.fixture(scope="module")
def rollout_cfg():
    return load_config(
        [
            "+recipe=quickstart",
            "rollout.n=3",
            "rollout.temperature=0.7",
            "rollout.top_p=0.9",
            "rollout.top_k=5",
            "rollout.max_response_length=17",
        ]
    )


def test_sampling_params_take_every_field_from_the_config(rollout_cfg):
    """n, temperature, top_p, top_k and max_tokens come from `rollout.*`, the seed from the call
    (all chosen unlike SamplingParams' defaults, so a dropped field shows)."""
    expected = SamplingParams(n=3, temperature=0.7, top_p=0.9, top_k=5, max_tokens=17, greedy=False, seed=11)
    assert sampling_params(rollout_cfg, seed=11) == expected


def test_sampling_params_n_and_greedy_from_the_arguments(rollout_cfg):
    """An explicit `n` replaces `rollout.n`; `greedy` is passed through; the rest stays."""
    got = sampling_params(rollout_cfg, seed=4, n=1, greedy=True)
    assert got == SamplingParams(n=1, temperature=0.7, top_p=0.9, top_k=5, max_tokens=17, greedy=True, seed=4)
    assert sampling_params(rollout_cfg, seed=0, n=6).n == 6


# -------------------------------------------------------------------- check_rollout_serves_adapter
LOSS_MASK = torch.tensor([[True, False, True, True], [True, False, False, False]])  # 4 loss tokens, with holes
TAIL = (
    "the adapter does not reach generation (merged weights without it, or an adapter the "
    "engine does not apply; verl #7014, #7495)"
)


def adapter_batch(d_policy, d_base, versions=(3, 5)) -> Batch:
    """Rollout log-probs -1 on the loss tokens; the policy's `d_policy[k]` and the base's `d_base[k]`
    below them on loss token k. Off the loss mask all three disagree wildly (must be ignored)."""
    rollout = torch.full((2, 4), -30.0)
    policy = torch.full((2, 4), -1.0)
    base = torch.full((2, 4), -7.0)
    rollout[LOSS_MASK] = -1.0
    policy[LOSS_MASK] = -1.0 - torch.tensor(d_policy)
    base[LOSS_MASK] = -1.0 - torch.tensor(d_base)
    return Batch(
        {
            "loss_mask": LOSS_MASK,
            "rollout_logprobs": rollout,
            "old_logprobs": policy,
            "ref_logprobs": base,
            "weight_version": torch.tensor(versions),
        }
    )


def test_adapter_served_is_checked_with_hand_computed_distances():
    """Rollout 16x closer to the policy than to the base, generator version 3 >= 1 + staleness 2:
    conclusive, adapter served; the distances are means of |diff| over the loss tokens only."""
    b = adapter_batch([0.125, 0.0, 0.25, 0.125], [2.0, 1.0, 3.0, 2.0])
    out = check_rollout_serves_adapter(b, staleness=2)
    assert out == {
        "lora/rollout_vs_policy": 0.125,  # (0.125 + 0 + 0.25 + 0.125) / 4
        "lora/rollout_vs_base": 2.0,  # (2 + 1 + 3 + 2) / 4
        "lora/policy_vs_base": 1.875,  # (1.875 + 1 + 2.75 + 1.875) / 4
        "lora/adapter_check": 1.0,
    }


def test_base_served_raises_naming_the_distances():
    """Rollout 16x closer to the base than to the policy: AdapterNotServedError with the batch's
    version and both distances."""
    b = adapter_batch([2.0, 1.0, 3.0, 2.0], [0.125, 0.0, 0.25, 0.125])
    msg = (
        "the rollouts' log-probs (batch of weight version 3) match the base model without the adapter "
        "(mean |diff| 0.125) better than the trained policy (2): " + TAIL
    )
    with pytest.raises(AdapterNotServedError, match="^" + re.escape(msg) + "$"):
        check_rollout_serves_adapter(b, staleness=0)


@pytest.mark.parametrize(
    "versions,staleness,judged",
    [((0, 4), 0, False), ((1, 4), 0, True), ((4, 1), 1, False), ((2, 3), 1, True), ((3, 3), 3, False)],
)
def test_judged_only_from_version_one_plus_staleness(versions, staleness, judged):
    """The oldest row's version must be >= 1 + staleness; before that a clearly base-served batch
    is inconclusive (adapter_check 0, no error), from there on it raises."""
    b = adapter_batch([2.0, 2.0, 2.0, 2.0], [0.25, 0.25, 0.25, 0.25], versions)
    if judged:
        with pytest.raises(AdapterNotServedError, match=f"batch of weight version {min(versions)}"):
            check_rollout_serves_adapter(b, staleness)
    else:
        out = check_rollout_serves_adapter(b, staleness)
        assert out == {
            "lora/rollout_vs_policy": 2.0,
            "lora/rollout_vs_base": 0.25,
            "lora/policy_vs_base": 1.75,
            "lora/adapter_check": 0.0,
        }


@pytest.mark.parametrize(
    "d_policy,d_base,separation,check",
    [
        (0.5, 2.0, None, 0.0),  # exactly 4x apart (the default): not conclusive
        (0.5, 2.25, None, 1.0),  # 4.5x apart: conclusive by default
        (0.5, 2.25, 5.0, 0.0),  # ... but not under separation 5
        (0.5, 2.5, 5.0, 0.0),  # exactly 5x
        (0.5, 3.0, 5.0, 1.0),
        (0.5, 0.5, 0.5, 1.0),  # a tie (judged only when separation < 1) is no evidence against the adapter
        (0.0, 0.0, None, 0.0),  # all equal: min 0, nothing to judge
    ],
)
def test_judged_only_when_separation_times_apart(d_policy, d_base, separation, check):
    """Conclusive only when the larger distance exceeds `separation` (default 4) times the smaller."""
    b = adapter_batch([d_policy] * 4, [d_base] * 4)
    out = check_rollout_serves_adapter(b, 0) if separation is None else check_rollout_serves_adapter(b, 0, separation)
    assert out["lora/adapter_check"] == check
    assert (out["lora/rollout_vs_policy"], out["lora/rollout_vs_base"]) == (d_policy, d_base)
    assert out["lora/policy_vs_base"] == abs(d_policy - d_base)


def test_no_loss_tokens_gives_zero_distances_and_no_verdict():
    """An empty loss mask: every distance is 0.0 (not NaN), nothing is judged even at a late version."""
    b = adapter_batch([2.0] * 4, [0.25] * 4, versions=(9, 9))
    b["loss_mask"] = torch.zeros(2, 4, dtype=torch.bool)
    assert check_rollout_serves_adapter(b, staleness=0) == {
        "lora/rollout_vs_policy": 0.0,
        "lora/rollout_vs_base": 0.0,
        "lora/policy_vs_base": 0.0,
        "lora/adapter_check": 0.0,
    }


def test_put_rows_brings_each_rank_s_rows_back_to_the_batch_order():
    """Ranks return their rows in plan order (`row_index`); the batch gets them in its own."""
    from rlpost.controller.step import put_rows

    batch = Batch({"response_ids": torch.zeros(5, 2, dtype=torch.long)})
    rows = [[3, 0], [4, 1, 2]]  # two ranks, rows in plan order
    parts = [
        Batch(
            {
                "old_logprobs": torch.tensor([[float(r), -r] for r in ranks]),
                "ref_logprobs": torch.tensor([[10.0 + r, r] for r in ranks]),
                "row_index": torch.tensor(ranks),
            }
        )
        for ranks in rows
    ]
    put_rows(batch, parts)
    assert torch.equal(batch["old_logprobs"], torch.tensor([[float(r), -r] for r in range(5)]))
    assert torch.equal(batch["ref_logprobs"], torch.tensor([[10.0 + r, r] for r in range(5)]))
    assert "row_index" not in batch
    without_ref = Batch({"response_ids": torch.zeros(5, 2, dtype=torch.long)})
    put_rows(without_ref, [Batch({k: p[k] for k in ("old_logprobs", "row_index")}) for p in parts])
    assert "ref_logprobs" not in without_ref and torch.equal(without_ref["old_logprobs"], batch["old_logprobs"])


# ------------------------------------------------------------------------- rewards per token
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
