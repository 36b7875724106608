"""Algorithm declarations, the REINFORCE++ estimators, batch filters and DAPO's reward shaping,
each against a hand-computed case or a plain loop written here."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpost.algos.advantages import ADVANTAGES, TOKEN_REWARDS, discounted_returns, normalize_over_tokens
from rlpost.algos.algorithms import ALGORITHMS, Algorithm, needed_roles, register_algorithm
from rlpost.algos.filters import BATCH_FILTERS, overlong_penalty, truncated, varied_groups
from rlpost.algos.policy_loss import POLICY_LOSSES
from rlpost.data.batch import Batch
from tests.helpers import examples


# ------------------------------------------------------------------------------ declarations
def test_every_declaration_names_registered_parts():
    assert {"grpo", "ppo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "dapo", "gspo", "cispo"} <= set(ALGORITHMS)
    for _, algo in ALGORITHMS.items():
        assert algo.advantage in ADVANTAGES and algo.policy_loss in POLICY_LOSSES, algo.name
        assert algo.batch_filter in BATCH_FILTERS, algo.name
        assert algo.kl == "loss" or algo.advantage in TOKEN_REWARDS, algo.name
    assert ALGORITHMS.get("gspo").policy_loss == "gspo" and ALGORITHMS.get("cispo").policy_loss == "cispo"
    assert ALGORITHMS.get("dapo").batch_filter == "dynamic_sampling"
    assert ALGORITHMS.get("reinforce_pp").kl == "reward" and ALGORITHMS.get("reinforce_pp_baseline").kl == "loss"
    assert ALGORITHMS.get("ppo").roles == ("critic",) and ALGORITHMS.get("ppo").advantage == "gae"
    with pytest.raises(KeyError, match="algo.name='nope'.*grpo"):
        ALGORITHMS.get("nope")


def test_a_role_the_algorithm_does_not_need_is_not_started():
    grpo = ALGORITHMS.get("grpo")
    assert needed_roles(grpo, kl_coef=0.0, reward_model=False) == ("actor", "rollout")
    assert needed_roles(grpo, kl_coef=0.1, reward_model=False) == ("actor", "rollout", "reference")
    assert needed_roles(grpo, kl_coef=0.0, reward_model=True) == ("actor", "rollout", "reward_model")
    critic = Algorithm("_c", "", "grpo", "ppo", roles=("critic",))
    assert needed_roles(critic, 0.0, False) == ("actor", "rollout", "critic")


@pytest.mark.parametrize(
    "algo, error",
    [
        (Algorithm("grpo", "", "grpo", "ppo"), "registered twice"),
        (Algorithm("_x", "", "grpo", "ppo", kl="logits"), "kl='logits'"),
        (Algorithm("_x", "", "grpo", "ppo", kl="reward"), "reads no per-token rewards"),
        (Algorithm("_x", "", "grpo", "ppo", roles=("judge",)), "unknown roles"),
    ],
)
def test_bad_declarations_are_refused(algo, error):
    before = ALGORITHMS.items()
    with pytest.raises(ValueError, match=error):
        register_algorithm(algo)
    assert ALGORITHMS.items() == before


# ------------------------------------------------------------------------------- REINFORCE++
def test_discounted_returns_hand_computed_with_a_hole():
    rewards = torch.tensor([[0.5, 9.0, -1.0, 2.0], [1.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    g = 0.5
    out = discounted_returns(rewards, mask, g)
    # row 0 over its own tokens 0, 2, 3 (the hole at 1 is skipped, not discounted)
    g3 = 2.0
    g2 = -1.0 + g * g3
    g0 = 0.5 + g * g2
    assert out.tolist() == [[g0, 0.0, g2, g3], [1.0, 0.0, 0.0, 0.0]]


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.floats(0.0, 1.0), st.integers(0, 10_000))
def test_discounted_returns_against_a_plain_loop(rows, width, gamma, seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(rows, width, generator=gen)
    mask = torch.rand(rows, width, generator=gen) > 0.3
    out = discounted_returns(rewards, mask, gamma)
    for i in range(rows):
        running = 0.0
        for t in reversed(range(width)):
            if mask[i, t]:
                running = float(rewards[i, t]) + gamma * running
                assert math.isclose(float(out[i, t]), running, rel_tol=1e-9, abs_tol=1e-9)
            else:
                assert out[i, t] == 0


def test_normalize_over_tokens_uses_the_loss_tokens_only():
    values = torch.tensor([[1.0, 100.0], [3.0, 5.0]])
    mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    out = normalize_over_tokens(values, mask)
    picked = torch.tensor([1.0, 3.0, 5.0], dtype=torch.float64)
    expected = (picked - 3.0) / (picked.std() + 1e-6)
    assert torch.allclose(out[mask].double(), expected, atol=1e-6) and out[0, 1] == 0
    assert normalize_over_tokens(values, torch.zeros_like(mask)).abs().sum() == 0  # nothing to normalise


def test_reinforce_pp_estimators_hand_computed():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]], dtype=torch.bool)
    token_rewards = torch.tensor([[-0.1, 1.0, 0.0], [0.0, 0.0, 0.0], [-0.2, 0.0, 0.5], [0.0, 0.0, 2.0]])
    batch = Batch(
        {
            "loss_mask": mask,
            "token_rewards": token_rewards,
            "rewards": torch.tensor([1.0, 0.0, 0.5, 2.0]),
            "group_ids": torch.tensor([0, 0, 1, 1]),
        }
    )
    algo = type("A", (), {"gamma": 0.9})  # (at 1.0 an estimator that ignored gamma would pass)
    # G_t = r_t + 0.9 G_t+1 over each row's loss tokens (a token outside the mask passes G on unchanged)
    returns = torch.tensor(
        [[-0.1 + 0.9, 1.0, 0.0], [0.0, 0.0, 0.0], [-0.2 + 0.9 * 0.45, 0.9 * 0.5, 0.5], [0.0, 1.8, 2.0]]
    )
    picked = returns[mask].double()
    expected = torch.where(mask, (returns - picked.mean()) / (picked.std() + 1e-6), 0.0)
    assert torch.allclose(ADVANTAGES["reinforce_pp"](batch, algo).double(), expected.double(), atol=1e-6)
    # baseline: r - group mean (0.5, -0.5, -0.75, 0.75) on every loss token, then normalised
    centred = torch.tensor([0.5, -0.5, -0.75, 0.75])[:, None].expand_as(mask)
    picked = centred[mask].double()
    expected = torch.where(mask, (centred - picked.mean()) / (picked.std() + 1e-6), 0.0)
    assert torch.allclose(ADVANTAGES["reinforce_pp_baseline"](batch, algo).double(), expected.double(), atol=1e-6)


# ------------------------------------------------------------------------- filters and shaping
def test_varied_groups_keeps_groups_whose_rewards_differ():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.0, 0.0, 2.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 3, 4])
    assert varied_groups(rewards, groups).tolist() == [False, False, True, True] + [False] * 5 + [False]
    # groups need not be contiguous or numbered from 0
    assert varied_groups(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([7, 3, 7])).tolist() == [False, False, False]
    assert varied_groups(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([7, 3, 7])).tolist() == [True, False, True]


def test_overlong_penalty_hand_computed():
    lengths = torch.tensor([1, 6, 7, 8, 10])
    # L = 10, buffer 4: free up to 6, then -1.5 * (l - 6) / 4
    assert overlong_penalty(lengths, 10, 4, 1.5).tolist() == [0.0, 0.0, -0.375, -0.75, -1.5]
    assert overlong_penalty(lengths, 10, 0, 1.5).tolist() == [0.0] * 5


def test_truncated_means_the_limit_without_eos():
    eos = 2
    ids = torch.tensor([[5, 6, 7], [5, 2, 0], [5, 6, 2], [5, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert truncated(ids, mask, eos, 3).tolist() == [True, False, False, False]
    assert truncated(ids, mask, eos, 1).tolist() == [True, False, False, True]  # a limit of 1


# ----------------------------------------------------------------------------------- PPO's parts
@settings(max_examples=examples(40), deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 10_000))
def test_gae_against_a_plain_loop(rows, width, gamma, lam, seed):
    """GAE over each row's loss tokens (holes skipped, EOS ends the episode), against the
    textbook recursion written one row at a time."""
    from rlpost.algos.advantages import gae_advantage

    gen = torch.Generator().manual_seed(seed)
    rewards, values = torch.randn(rows, width, generator=gen), torch.randn(rows, width, generator=gen)
    lengths = torch.randint(0, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width) < lengths[:, None]) & (torch.rand(rows, width, generator=gen) > 0.25)
    adv, returns = gae_advantage(rewards, values, mask, gamma, lam)
    for i in range(rows):
        steps = [t for t in range(width) if mask[i, t]]
        a, expected = 0.0, {}
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_value = float(values[i, steps[k + 1]]) if k + 1 < len(steps) else 0.0
            delta = float(rewards[i, t]) + gamma * next_value - float(values[i, t])
            a = delta + gamma * lam * a
            expected[t] = a
        for t in range(width):
            want = expected.get(t, 0.0)
            assert math.isclose(float(adv[i, t]), want, rel_tol=1e-9, abs_tol=1e-9)
            want_return = want + float(values[i, t]) if t in expected else 0.0
            assert math.isclose(float(returns[i, t]), want_return, rel_tol=1e-9, abs_tol=1e-9)


def test_gae_with_lambda_one_is_returns_minus_values_and_is_whitened():
    from rlpost.algos.advantages import gae_advantage

    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    values = torch.tensor([[0.2, 0.4, 0.6], [0.1, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    adv, returns = gae_advantage(rewards, values, mask, 1.0, 1.0)
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.0, 0.0]], dtype=torch.float64))
    assert torch.allclose(adv, torch.tensor([[0.8, 0.6, 0.4], [0.4, 0.0, 0.0]], dtype=torch.float64))
    batch = Batch({"token_rewards": rewards, "values": values, "loss_mask": mask})
    algo = type("A", (), {"gamma": 1.0, "lam": 1.0})
    whitened, targets = ADVANTAGES["gae"](batch, algo)
    picked = torch.tensor([0.8, 0.6, 0.4, 0.4], dtype=torch.float64)
    assert torch.allclose(whitened[mask].double(), (picked - picked.mean()) / (picked.std() + 1e-6), atol=1e-6)
    assert torch.allclose(targets, returns.float())  # the critic's targets are not whitened


def test_the_registered_gae_reads_gamma_and_lambda_each_in_its_place():
    """gamma 0.9 and lambda 0.5, worked by hand: swapped, or either ignored, the advantages differ (the
    lambda = 1 test above holds whatever the estimator does with them)."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    values = torch.tensor([[0.2, 0.4, 0.6], [0.1, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    # row 0: deltas 0.9*0.4 - 0.2 = 0.16, 0.9*0.6 - 0.4 = 0.14, 1 - 0.6 = 0.4; A_t = delta_t + 0.45 A_t+1
    a2 = 0.4
    a1 = 0.14 + 0.45 * a2
    a0 = 0.16 + 0.45 * a1
    picked = torch.tensor([a0, a1, a2, 0.5 - 0.1], dtype=torch.float64)
    batch = Batch({"token_rewards": rewards, "values": values, "loss_mask": mask})
    whitened, targets = ADVANTAGES["gae"](batch, type("A", (), {"gamma": 0.9, "lam": 0.5}))
    assert torch.allclose(whitened[mask].double(), (picked - picked.mean()) / (picked.std() + 1e-6), atol=1e-6)
    assert torch.allclose(targets[mask].double(), picked + values[mask].double(), atol=1e-6)


def test_clipped_value_loss_hand_computed():
    from rlpost.algos.losses import clipped_value_loss

    values = torch.tensor([1.0, 0.0, 2.0, 0.5])
    old = torch.tensor([0.0, 0.0, 0.0, 0.4])
    returns = torch.tensor([2.0, 1.0, 0.0, 0.5])
    loss, clipped = clipped_value_loss(values, old, returns, 0.5)
    # v=1 moved 1 from 0: clipped to 0.5 -> (0.5-2)^2=2.25 > (1-2)^2=1: the clipped term
    # v=0: no move, (0-1)^2 = 1 both; v=2 -> 0.5: (2-0)^2=4 > 0.25: unclipped; v=0.5 from 0.4: inside
    assert loss.tolist() == [0.5 * 2.25, 0.5, 2.0, 0.0]
    assert clipped.tolist() == [True, False, False, False]


def test_adaptive_kl_controller_follows_ziegler():
    from rlpost.algos.kl_control import KLController

    fixed = KLController(0.1)
    fixed.update(5.0, 100)
    assert fixed.coef == 0.1
    kl = KLController(0.1, target=1.0, horizon=1000)
    kl.update(1.5, 100)  # error clipped to +0.2: coef * (1 + 0.2 * 100 / 1000)
    assert math.isclose(kl.coef, 0.1 * 1.02)
    kl.update(0.9, 100)  # error -0.1
    assert math.isclose(kl.coef, 0.1 * 1.02 * (1 - 0.1 * 0.1))
    kl.update(0.0, 1000)  # error clipped to -0.2
    assert math.isclose(kl.coef, 0.1 * 1.02 * 0.99 * 0.8)


def test_a_batch_filter_is_registered_once_under_its_name(monkeypatch):
    first = BATCH_FILTERS["dynamic_sampling"]
    with pytest.raises(ValueError, match=r"^batch filter 'dynamic_sampling' is registered twice$"):
        BATCH_FILTERS.register("dynamic_sampling", lambda r, g: None)
    assert BATCH_FILTERS["dynamic_sampling"] is first
    monkeypatch.setattr(BATCH_FILTERS, "_values", dict(BATCH_FILTERS._values))  # registrations undone afterwards

    def mine(rewards, groups):
        return None

    assert BATCH_FILTERS.register("_probe", mine) is mine and BATCH_FILTERS["_probe"] is mine


def test_filters_on_empty_and_smallest_inputs():
    assert varied_groups(torch.zeros(0), torch.zeros(0, dtype=torch.long)).tolist() == []
    assert overlong_penalty(torch.tensor([3, 4]), 4, 1, 2.0).tolist() == [0.0, -2.0]  # a buffer of one token


def test_adaptive_kl_divides_by_the_target():
    from rlpost.algos.kl_control import KLController

    kl = KLController(0.1, target=2.0, horizon=1000)
    kl.update(2.2, 100)  # error 2.2 / 2 - 1 = 0.1
    assert math.isclose(kl.coef, 0.1 * (1 + 0.1 * 0.1))
