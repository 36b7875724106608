"""controller/alerts.py: a step that cannot learn is said when it starts, not every step."""

from __future__ import annotations

from rlpost.config import load_config
from rlpost.controller.alerts import Alerts, no_signal

LEARNS = {"response_length/truncated_frac": 0.25, "reward/uniform_groups": 0.5, "reward/mean": 0.4}


def test_every_response_cut_off_is_named_with_its_key():
    cfg = load_config(["+recipe=quickstart", "rollout.max_response_length=1"])
    found = no_signal(cfg, 3, {**LEARNS, "response_length/truncated_frac": 1.0})
    assert list(found) == ["truncated"]
    assert "step 3" in found["truncated"] and "rollout.max_response_length=1 " in found["truncated"]
    assert no_signal(cfg, 3, LEARNS) == {}


def test_uniform_groups_stop_a_group_baseline_and_the_likely_cause_is_named():
    cold = load_config(["+recipe=quickstart", "rollout.temperature=1e-6"])
    found = no_signal(cold, 2, {**LEARNS, "reward/uniform_groups": 1.0})
    assert list(found) == ["uniform"] and "rollout.temperature=1e-06 makes" in found["uniform"]
    assert "algo.name=grpo's advantages are all 0" in found["uniform"]
    warm = load_config(["+recipe=quickstart"])
    found = no_signal(warm, 2, {**LEARNS, "reward/uniform_groups": 1.0, "reward/mean": 0.0})
    assert "every answer is right or every one wrong (reward/mean 0.000)" in found["uniform"]
    # a critic's advantages do not need the group to differ: PPO learns from a uniform batch
    ppo = load_config(["+recipe=ppo"])
    assert no_signal(ppo, 2, {**LEARNS, "reward/uniform_groups": 1.0}) == {}


def test_a_collapsed_policy_names_the_learning_rate():
    cfg = load_config(["+recipe=quickstart", "trainer.optim.lr=10"])
    found = no_signal(cfg, 3, {**LEARNS, "actor/entropy": 0.0, "actor/grad_norm": 0.0})
    assert list(found) == ["collapsed"] and "(now trainer.optim.lr=10): lower it" in found["collapsed"]
    assert no_signal(cfg, 3, {**LEARNS, "actor/entropy": 0.0, "actor/grad_norm": 0.3}) == {}  # still moving
    assert no_signal(cfg, 3, {**LEARNS, "actor/entropy": 0.02, "actor/grad_norm": 0.0}) == {}  # no step taken
    cold = load_config(["+recipe=quickstart", "rollout.temperature=1e-6"])  # the temperature's doing, said as such
    stuck = {**LEARNS, "actor/entropy": 0.0, "actor/grad_norm": 0.0, "reward/uniform_groups": 1.0}
    assert list(no_signal(cold, 3, stuck)) == ["uniform"]


def test_each_kind_is_said_when_it_starts_and_again_only_after_a_step_without_it():
    cfg = load_config(["+recipe=quickstart"])
    said = []
    alerts = Alerts(cfg, said.append)
    cut = {**LEARNS, "response_length/truncated_frac": 1.0}
    both = {**cut, "reward/uniform_groups": 1.0}
    for step, metrics in enumerate([cut, both, both, LEARNS, cut], 1):
        alerts.check(step, metrics)
    assert [m.split(" ")[1:6] for m in said] == [
        ["every", "response", "of", "step", "1"],
        ["in", "step", "2", "every", "prompt's"],
        ["every", "response", "of", "step", "5"],
    ]


def test_metrics_a_step_did_not_report_raise_no_alert():
    """A step whose metrics lack a key (no truncation measured, no groups) is not said to fail on it."""
    cfg = load_config(["+recipe=quickstart"])
    assert no_signal(cfg, 1, {}) == {}
    assert no_signal(cfg, 1, {"reward/uniform_groups": 0.5}) == {}


def test_uniform_groups_without_a_mean_reward_say_nan():
    cfg = load_config(["+recipe=quickstart", "rollout.temperature=0.7"])
    found = no_signal(cfg, 2, {"reward/uniform_groups": 1.0})
    assert "(reward/mean nan)" in found["uniform"]


def test_the_temperature_edge_is_0_1_exactly():
    """At rollout.temperature=0.1 the temperature is not blamed: uniform groups name the reward,
    and a collapse is said as such."""
    cfg = load_config(["+recipe=quickstart", "rollout.temperature=0.1"])
    found = no_signal(cfg, 2, {**LEARNS, "reward/uniform_groups": 1.0, "reward/mean": 1.0})
    assert "every answer is right or every one wrong (reward/mean 1.000)" in found["uniform"]
    collapsed = no_signal(cfg, 2, {**LEARNS, "actor/entropy": 0.0, "actor/grad_norm": 0.0})
    assert list(collapsed) == ["collapsed"]


def test_an_entropy_of_exactly_1e_6_is_not_a_collapse():
    cfg = load_config(["+recipe=quickstart"])
    assert no_signal(cfg, 2, {**LEARNS, "actor/entropy": 1e-6, "actor/grad_norm": 0.0}) == {}
    assert list(no_signal(cfg, 2, {**LEARNS, "actor/entropy": 9e-7, "actor/grad_norm": 0.0})) == ["collapsed"]
