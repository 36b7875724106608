import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpost.algos.advantages import ADVANTAGES, get_advantage, grpo_advantage, rloo_advantage
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
        get_advantage("nope")


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(-5, 5)), min_size=1, max_size=40))
def test_grpo_groups_are_zero_mean(pairs):
    groups = torch.tensor([g for g, _ in pairs])
    rewards = torch.tensor([r for _, r in pairs])
    adv = grpo_advantage(rewards, groups, norm_by_std=False)
    for g in groups.unique():
        assert abs(adv[groups == g].sum().item()) < 1e-4
