"""The pure parts of a training step (rlpost.controller.step): the batch's metrics, the staleness
guard, the padding a plan would compute, the sampling settings, the LoRA adapter guard and the
rows that ranks return (the reward of each token: test_token_rewards.py)."""

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
    logprob_agreement,
    plan_padding_fraction,
    sampling_params,
)
from rlpost.data.batch import Batch
from rlpost.rollout.base import SamplingParams
from tests.helpers import metrics_batch


# ----------------------------------------------------------------------------------- batch_metrics
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
        "rollout/logprob_diff_p999": 1.0,  # the 5th smallest of 5
        "rollout/logprob_diff_max_rollout_logprob": -2.0,  # row 1's first token: the rollout's -2.0
        "rollout/logprob_diff_max_trainer_logprob": -1.0,  # against the trainer's -1.0
        "rollout/logprob_diff_max_token": 1.0,  # row 1's response_ids[0]
        "rollout/logprob_diff_max_position": 0.0,
        "rollout/weight_version": 2.5,
        "perf/tokens": 18.0,  # 2 + 2 + 3 + 3 prompt tokens, 3 + 1 + 2 + 2 response tokens
    }
    assert all(type(v) is float for v in m.values())


@pytest.mark.parametrize("far, p999", [(1, 0.01), (2, 0.01), (3, 5.0)])
def test_the_gap_percentile_is_a_tail_that_one_token_does_not_make(far, p999):
    """2000 tokens: the 99.9th percentile is the 1998th smallest gap; `far` tokens 5 nats off."""
    rollout = torch.full((1, 2000), -1.0)
    rollout[0, :far] = -6.0
    batch = Batch({"loss_mask": torch.ones(1, 2000, dtype=torch.bool), "rollout_logprobs": rollout})
    batch["old_logprobs"] = torch.full((1, 2000), -1.01)
    m = logprob_agreement(batch)
    assert m["rollout/logprob_diff_max"] == pytest.approx(4.99)
    assert m["rollout/logprob_diff_p999"] == pytest.approx(p999 if p999 < 1 else 4.99, abs=1e-6)
    assert (m["rollout/logprob_diff_max_rollout_logprob"], m["rollout/logprob_diff_max_trainer_logprob"]) == (
        -6.0,
        pytest.approx(-1.01),
    )


def test_the_token_at_the_largest_gap_is_named_by_its_id_and_place_in_its_response():
    """The largest gap at row 1, place 2 (a hole in the loss mask before it, and a larger gap in the
    hole that does not count): its token id and place, not the row's or the batch's first."""
    batch = Batch(
        {
            "response_ids": torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24]]),
            "loss_mask": torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]], dtype=torch.bool),
            "rollout_logprobs": torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-1.0, -9.0, -4.0, -1.0]]),
            "old_logprobs": torch.full((2, 4), -1.5),
        }
    )
    m = logprob_agreement(batch)
    assert m["rollout/logprob_diff_max"] == pytest.approx(2.5)
    assert (m["rollout/logprob_diff_max_token"], m["rollout/logprob_diff_max_position"]) == (23.0, 2.0)


def test_batch_metrics_of_multi_turn_episodes_hand_computed():
    """Episodes add the env/* metrics: turns and tool calls per episode, failed calls, timeouts and
    steps that raised in all, the environment's rewards, the share of response tokens that are the
    model's."""
    batch = metrics_batch()
    batch["env_turns"] = torch.tensor([1.0, 2.0, 3.0, 2.0])
    batch["env_tool_calls"] = torch.tensor([0.0, 1.0, 3.0, 0.0])
    batch["env_tool_errors"] = torch.tensor([0.0, 1.0, 2.0, 0.0])
    batch["env_timeouts"] = torch.tensor([0.0, 0.0, 1.0, 1.0])
    batch["env_errors"] = torch.tensor([1.0, 0.0, 0.0, 1.0])
    batch["env_reward"] = torch.tensor([0.5, 0.0, -1.0, 0.0])
    m = batch_metrics(batch, torch.tensor([1.0, 0.0, 0.5, 0.5]), reward_errors={}, n=2)
    assert {k: v for k, v in m.items() if k.startswith("env/")} == {
        "env/turns_mean": 2.0,
        "env/tool_calls_mean": 1.0,
        "env/tool_errors": 3.0,
        "env/timeouts": 2.0,
        "env/errors": 2.0,
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


@pytest.mark.parametrize("layout, cuts", [("packed", [[0, 1, 2, 3]]), ("padded", [[0, 1, 2], [3]])])
def test_step_plan_counts_a_padded_layouts_padding_against_the_token_budget(layout, cuts):
    """Rows of 2+3 tokens beside one of 2+98: 113 real tokens fit a budget of 200, but padded
    the four rows are 4 x 100 (the logits of a padded forward)."""
    from rlpost.controller.step import step_plan

    cfg = load_config(
        [
            "+recipe=quickstart",
            "trainer.world_size=1",
            "data.train_batch_size=1",
            "rollout.n=4",
            f"trainer.layout={layout}",
            "trainer.max_tokens_per_microbatch=200",
        ]
    )
    prompt = torch.tensor([[True, True]] * 4)
    response = torch.zeros(4, 98, dtype=torch.bool)
    response[:3, :3] = True
    response[3, :] = True
    _, plan = step_plan(Batch({"prompt_mask": prompt, "response_mask": response}), cfg)
    assert plan == [[cuts]]


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
