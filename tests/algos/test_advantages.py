import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpost.algos.advantages import ADVANTAGES, grpo_advantage, rloo_advantage
from tests.helpers import examples


def test_grpo_hand_computed():
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = grpo_advantage(rewards, groups, eps=0.0)
    s = math.sqrt(1 / 3)
    assert torch.allclose(adv[:4], torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s]))
    # group 1: identical rewards -> zero advantage (std 0 guarded by eps)
    assert torch.all(grpo_advantage(rewards, groups)[4:] == 0)


def test_dr_grpo_skips_std():
    rewards = torch.tensor([3.0, 1.0, 2.0])
    adv = grpo_advantage(rewards, torch.zeros(3, dtype=torch.long), norm_by_std=False)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0]))


def test_single_sample_group_has_zero_advantage():
    adv = grpo_advantage(torch.tensor([5.0, 1.0, 0.0]), torch.tensor([7, 8, 8]))
    assert adv[0] == 0


def test_rloo_leave_one_out():
    rewards = torch.tensor([1.0, 0.0, 0.0])
    adv = rloo_advantage(rewards, torch.zeros(3, dtype=torch.long))
    # r_i - mean(others): 1 - 0, 0 - 0.5, 0 - 0.5
    assert torch.allclose(adv, torch.tensor([1.0, -0.5, -0.5]))


def test_registry_names_choices():
    assert {"grpo", "rloo"} <= set(ADVANTAGES)
    with pytest.raises(KeyError, match="choose one of"):
        ADVANTAGES.get("nope")


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(-5, 5)), min_size=1, max_size=40))
def test_grpo_groups_are_zero_mean(pairs):
    groups = torch.tensor([g for g, _ in pairs])
    rewards = torch.tensor([r for _, r in pairs])
    adv = grpo_advantage(rewards, groups, norm_by_std=False)
    for g in groups.unique():
        assert abs(adv[groups == g].sum().item()) < 1e-4


def loo_reference(rewards: list[float], groups: list[int], norm_by_std: bool, eps: float = 1e-6) -> torch.Tensor:
    """RLOO from scratch in float64: r_i minus the mean of the other samples of its group, divided
    by the unbiased group std + eps when asked; 0 for a group of one."""
    out = []
    for i, (r, g) in enumerate(zip(rewards, groups)):
        group = [rewards[j] for j in range(len(rewards)) if groups[j] == g]
        others = [rewards[j] for j in range(len(rewards)) if groups[j] == g and j != i]
        if not others:
            out.append(0.0)
            continue
        adv = r - sum(others) / len(others)
        if norm_by_std:
            mean = sum(group) / len(group)
            adv /= math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1)) + eps
        out.append(adv)
    return torch.tensor(out, dtype=torch.float64)


def grpo_reference(rewards: list[float], groups: list[int], eps: float = 1e-6) -> torch.Tensor:
    """GRPO from scratch in float64: (r_i - group mean) / (unbiased group std + eps); 0 for a group of one."""
    out = []
    for r, g in zip(rewards, groups):
        group = [x for x, h in zip(rewards, groups) if h == g]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / max(len(group) - 1, 1))
        out.append((r - mean) / (std + eps) if len(group) > 1 else 0.0)
    return torch.tensor(out, dtype=torch.float64)


# a group whose std (~7e-7) is below the default eps 1e-6, one of three, one of one
TINY = torch.tensor([0.0, 1e-6, 3.0, 1.0, 0.5, 4.0])
TINY_GROUPS = torch.tensor([0, 0, 1, 1, 1, 2])


def test_rloo_of_a_pair_is_the_difference():
    """Group of two: r_i - r_other (n / (n - 1) = 2, not clamped further); a singleton beside it 0."""
    adv = rloo_advantage(torch.tensor([3.0, 1.0, 7.0]), torch.tensor([4, 4, 9]))
    assert adv.tolist() == [2.0, -2.0, 0.0]


def test_rloo_norm_by_std_against_float64_reference():
    """RLOO / (std + eps) with the default eps 1e-6, where eps is as large as the group's std."""
    values = TINY.double().tolist()  # the float32 rewards, exactly
    adv = rloo_advantage(TINY, TINY_GROUPS, norm_by_std=True)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv.double(), loo_reference(values, TINY_GROUPS.tolist(), True), rtol=1e-6, atol=0)
    torch.testing.assert_close(
        rloo_advantage(TINY, TINY_GROUPS).double(),
        loo_reference(values, TINY_GROUPS.tolist(), False),
        rtol=1e-6,
        atol=0,
    )
    # by hand, the pair's first: (0 - 1e-6) / (std 1e-6 * sqrt(1/2) + eps 1e-6)
    assert adv[0].item() == pytest.approx(-1 / (1 + math.sqrt(0.5)), rel=1e-5)


def test_rloo_singleton_is_zero_even_where_std_is_zero():
    """A group of one has advantage 0 with norm_by_std, also with eps 0 (0 / 0 must not leak NaN)."""
    rewards, groups = torch.tensor([5.0, 1.0, 0.0]), torch.tensor([7, 8, 8])
    for eps in (0.0, 1e-6):
        adv = rloo_advantage(rewards, groups, norm_by_std=True, eps=eps)
        assert adv[0].item() == 0.0
        assert torch.isfinite(adv).all()
    assert grpo_advantage(rewards, groups, eps=0.0)[0].item() == 0.0


def test_grpo_with_default_eps_against_float64_reference():
    """GRPO's (r - mean) / (std + eps) with the default eps on a group of std ~7e-7."""
    adv = grpo_advantage(TINY, TINY_GROUPS)
    torch.testing.assert_close(
        adv.double(), grpo_reference(TINY.double().tolist(), TINY_GROUPS.tolist()), rtol=1e-6, atol=0
    )


def test_registering_a_name_twice_is_refused():
    """A second estimator under an existing name raises, naming it, and leaves the first in place."""
    first = ADVANTAGES["grpo"]
    with pytest.raises(ValueError, match=r"^advantage estimator 'grpo' is registered twice$"):
        ADVANTAGES.register("grpo")(lambda batch, algo: batch["rewards"])
    assert ADVANTAGES["grpo"] is first


def test_a_registered_estimator_is_the_one_its_name_returns(monkeypatch):
    from rlpost.algos.advantages import ADVANTAGES

    monkeypatch.setattr(ADVANTAGES, "_values", dict(ADVANTAGES._values))  # registrations undone afterwards

    def mine(batch, algo):
        return batch["rewards"] * 2

    assert ADVANTAGES.register("_probe")(mine) is mine
    assert ADVANTAGES.get("_probe") is mine


def test_normalize_over_tokens_edges():
    from rlpost.algos.advantages import normalize_over_tokens

    two = normalize_over_tokens(torch.tensor([[1.0, 3.0]]), torch.tensor([[True, True]]))
    s = torch.tensor([1.0, 3.0]).std().item()
    assert torch.allclose(two, torch.tensor([[-1.0, 1.0]]) / (s + 1e-6))  # two tokens are enough
    one = normalize_over_tokens(torch.tensor([[5.0, 7.0]], dtype=torch.float64), torch.tensor([[True, False]]))
    assert one.dtype == torch.float32 and one.tolist() == [[0.0, 0.0]]
    tiny = torch.tensor([[0.0, 1e-6, 2e-6]], dtype=torch.float64)  # std 1e-6: eps doubles it
    out = normalize_over_tokens(tiny, torch.ones(1, 3, dtype=torch.bool))
    assert torch.allclose(out.double(), torch.tensor([[-0.5, 0.0, 0.5]], dtype=torch.float64), atol=1e-6)
