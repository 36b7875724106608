"""controller/alerts.py: a step that cannot learn is said when it starts, not every step."""

from __future__ import annotations

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller.alerts import Alerts, episodes_cut, no_signal, setting_warnings

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
    gsm8k = load_config(["+recipe=quickstart", "reward.fn=gsm8k"])  # the fifteenth catalogue's t25: it is named
    found = no_signal(gsm8k, 2, {**LEARNS, "reward/uniform_groups": 1.0, "reward/mean": 0.0})
    assert found["uniform"].endswith(
        "or reward.fn=gsm8k gives these answers one score (does it read the task's answer format?)"
    )
    # a critic's advantages do not need the group to differ: PPO learns from a uniform batch
    ppo = load_config(["+recipe=ppo"])
    assert no_signal(ppo, 2, {**LEARNS, "reward/uniform_groups": 1.0}) == {}


def test_a_collapsed_policy_names_the_learning_rate():
    cfg = load_config(["+recipe=quickstart", "trainer.optim.lr=10"])
    found = no_signal(cfg, 3, {**LEARNS, "actor/entropy": 0.0, "actor/grad_norm": 0.0})
    assert list(found) == ["collapsed"] and "(now trainer.optim.lr=10): lower it" in found["collapsed"]
    assert no_signal(cfg, 3, {**LEARNS, "actor/entropy": 0.0, "actor/grad_norm": 0.3}) == {}  # still moving
    assert no_signal(cfg, 3, {**LEARNS, "actor/entropy": 0.02, "actor/grad_norm": 0.0}) == {}  # no step taken
    assert no_signal(cfg, 3, {**LEARNS, "actor/grad_norm": 0.0}) == {}  # a step without the entropy logged
    assert no_signal(cfg, 3, {**LEARNS, "actor/entropy": 0.0}) == {}  # nor the gradient norm
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


def test_one_skipped_optimizer_step_of_the_actor_is_said_in_full():
    cfg = load_config(["+recipe=quickstart"], this_machine=False)
    found = no_signal(cfg, 4, {**LEARNS, "actor/skipped_steps": 1.0})
    assert found == {
        "skipped_actor": "warning: in step 4 1 optimizer steps of the actor were skipped (actor/skipped_steps): its "
        "gradient norm was not finite, so it did not train; rewards or values too large for float32 (above about "
        "1e19) overflow its loss: scale the reward down"
    }
    far = no_signal(cfg, 4, {**LEARNS, "actor/skipped_steps": 1.0, "rollout/logprob_diff_mean": 1.58})
    assert far["skipped_actor"].endswith(  # the seventh catalogue's s23: the reward was blamed for this
        "so it did not train; the rollout's log-probs are 1.58 nats a token from the trainer's "
        "(rollout/logprob_diff_mean): the two do not hold the same model or sample the same distribution"
    )
    near = no_signal(cfg, 4, {**LEARNS, "actor/skipped_steps": 1.0, "rollout/logprob_diff_mean": 0.5})
    assert near == found
    nat = no_signal(cfg, 4, {**LEARNS, "actor/skipped_steps": 1.0, "rollout/logprob_diff_mean": 1.0})
    assert "1.00 nats a token from the trainer's" in nat["skipped_actor"]  # above 0.5 nats is far
    short = load_config(["+recipe=quickstart", "rollout.max_response_length=7"], this_machine=False)
    cut = no_signal(short, 4, {**LEARNS, "response_length/truncated_frac": 1.0})
    assert cut["truncated"] == (
        "warning: every response of step 4 reached rollout.max_response_length=7 tokens without ending "
        "(response_length/truncated_frac 1.0): the answers are cut off; raise it"
    )


def warmup_warning(section: str, warmup: int, steps: int, lr: float, decay: str) -> str:
    return (
        f"warning: {section}.optim.warmup_steps={warmup} is not below the run's {steps} optimizer steps "
        f"(trainer.total_steps x algo.ppo_epochs x mini-batches a batch): the learning rate never reaches "
        f"{section}.optim.lr={lr:g}{decay}"
    )


def test_a_warmup_as_long_as_the_run_is_said_and_a_cosine_decay_with_it():
    # 2 steps x 1 epoch x 1 mini-batch: 2 optimizer steps; a warm-up of exactly 2 never reaches the rate
    base = ["+recipe=quickstart", "trainer.total_steps=2", "trainer.optim.warmup_steps=2", "trainer.optim.lr=0.25"]
    cosine = load_config([*base, "trainer.optim.lr_schedule=cosine"], this_machine=False)
    assert setting_warnings(cosine) == [warmup_warning("trainer", 2, 2, 0.25, " and the cosine decay never starts")]
    constant = load_config([*base, "trainer.optim.lr_schedule=constant"], this_machine=False)
    assert setting_warnings(constant) == [warmup_warning("trainer", 2, 2, 0.25, "")]


def test_the_critics_warmup_is_checked_only_where_the_algorithm_has_a_critic():
    # PPO: 2 steps x 1 epoch x (64 // 16) mini-batches = 8 optimizer steps
    ppo = ["+recipe=ppo", "trainer.total_steps=2", "trainer.optim.warmup_steps=0", "critic.optim.lr=0.5"]
    ppo.append("critic.warmup_steps=1")  # (one step of the policy's: its own warning is not this test's)
    cfg = load_config([*ppo, "critic.optim.warmup_steps=8", "critic.optim.lr_schedule=constant"], this_machine=False)
    assert setting_warnings(cfg) == [warmup_warning("critic", 8, 8, 0.5, "")]
    assert setting_warnings(load_config([*ppo, "critic.optim.warmup_steps=7"], this_machine=False)) == []
    # GRPO has no critic: a critic section it never builds is refused by name (the twelfth catalogue's t197)
    grpo = ["+recipe=quickstart", "trainer.total_steps=2", "trainer.optim.warmup_steps=0"]
    with pytest.raises(ConfigError, match=r"^critic.optim.warmup_steps=500: read only by algorithms with a critic"):
        load_config([*grpo, "critic.optim.warmup_steps=500"], this_machine=False)


def test_a_microbatch_budget_warns_only_below_one_sequence():
    lengths = ["+recipe=quickstart", "data.max_prompt_length=20", "rollout.max_response_length=12"]  # 32 tokens
    exact = load_config([*lengths, "trainer.max_tokens_per_microbatch=32"], this_machine=False)
    assert setting_warnings(exact) == []
    one = load_config([*lengths, "trainer.max_tokens_per_microbatch=1"], this_machine=False)
    [said] = setting_warnings(one)
    assert said.startswith("warning: trainer.max_tokens_per_microbatch=1 is below one sequence's 32 tokens ")


def test_a_critic_warmup_as_long_as_the_run_and_a_zero_learning_rate_are_said():
    """The seventh catalogue's s36 and s35: PPO whose critic warms up for the whole run, and a
    learning rate of 0, trained nothing without a word."""
    ppo = ["+recipe=ppo", "trainer.total_steps=3"]
    said = setting_warnings(load_config([*ppo, "critic.warmup_steps=3"], this_machine=False))
    assert said == [
        "warning: critic.warmup_steps=3 is not below trainer.total_steps=3: only the critic trains in this run, "
        "the policy never does"
    ]
    assert setting_warnings(load_config([*ppo, "critic.warmup_steps=2"], this_machine=False)) == []
    with pytest.raises(ConfigError, match=r"^critic.warmup_steps=99: read only by algorithms with a critic \(ppo"):
        load_config(["+recipe=quickstart", "critic.warmup_steps=99"], this_machine=False)  # no critic: refused
    frozen = load_config(["+recipe=quickstart", "trainer.optim.lr=0"], this_machine=False)
    assert "warning: trainer.optim.lr=0: the policy's weights never change (it measures; it does not train)" in (
        setting_warnings(frozen)
    )


def test_episodes_cut_short_are_said_from_half_of_the_step_by_kind():
    cfg = load_config(["+recipe=quickstart", "env.name=retry", "env.timeout_s=2"], this_machine=False)
    half = cfg.data.train_batch_size * cfg.rollout.n / 2
    assert list(episodes_cut(cfg, 5, {"env/timeouts": half})) == ["env_timeouts"]  # exactly half; no errors logged
    assert list(episodes_cut(cfg, 5, {"env/errors": half})) == ["env_errors"]
    assert episodes_cut(cfg, 5, {"env/timeouts": 0.8 * half, "env/errors": 0.8 * half}) == {}  # 40%: not said
    plain = load_config(["+recipe=quickstart"], this_machine=False)  # no environment: nothing to say
    assert episodes_cut(plain, 5, {"env/timeouts": 2 * half, "env/errors": 2 * half}) == {}


def test_a_policy_pushed_toward_random_tokens_names_the_learning_rate():
    """The eleventh catalogue's t56: lr=1000 made the policy uniform (entropy 4.48, reward 0) and the
    warnings blamed the data and the response length."""
    cfg = load_config(["+recipe=quickstart", "trainer.optim.lr=1000"], this_machine=False)
    said = []
    alerts = Alerts(cfg, said.append)
    alerts.check(1, {**LEARNS, "actor/entropy": 1.2, "reward/mean": 0.4})
    alerts.check(2, {**LEARNS, "actor/entropy": 1.8, "reward/mean": 0.2})  # both by half: said
    alerts.check(3, {**LEARNS, "actor/entropy": 4.48, "reward/mean": 0.0})  # still: not again
    assert said == [
        "warning: in step 2 the policy's entropy is 1.80 nats a token (the first step's 1.20) and its reward 0.200 "
        "(the first step's 0.400) (actor/entropy, reward/mean): the updates pushed it toward random tokens; too "
        "large a step does this (now trainer.optim.lr=1000): lower it and start again"
    ]
    # short of half on one of them, sharper, no reward to lose, or a policy near certain either way
    for first, now in (((1.2, 0.4), (1.7, 0.25)), ((1.2, 0.4), (1.9, 0.3)), ((1.2, 0.4), (0.4, 0.1)),
                       ((1.2, 0.0), (4.0, 0.0)), ((0.1, 0.4), (0.3, 0.1))):  # fmt: skip
        quiet = Alerts(cfg, said.append)
        for step, (entropy, reward) in enumerate((first, now), 1):
            quiet.check(step, {**LEARNS, "actor/entropy": entropy, "reward/mean": reward})
    assert len(said) == 1


@pytest.mark.parametrize(
    "e0, e1, said",
    [
        (2.0, 3.0, True),  # exactly half again: said
        (2.0, 2.9, False),  # (1.5 / e0 = 0.75 would say it)
        (0.2, 0.5, False),  # up by more than half, but 0.5 nats a token is not a spread policy
        (0.2, 0.51, True),  # just above it (a limit of 1.5 nats would not say it)
    ],
)
def test_a_spread_is_said_from_half_again_the_first_entropy_and_above_half_a_nat(e0, e1, said):
    """`spread`'s limits, at the values where each comparison decides (the mutation run's survivors)."""
    from rlpost.controller.alerts import spread

    cfg = load_config(["+recipe=quickstart"])
    first, now = {"actor/entropy": e0, "reward/mean": 0.8}, {"actor/entropy": e1, "reward/mean": 0.4}
    assert bool(spread(cfg, 5, first, now)) == said
    assert list(spread(cfg, 5, first, now)) == ["spread"] * said


def test_validation_scores_above_1_are_said_once_as_not_an_accuracy():
    """The fourteenth catalogue's t01: a reward of 10 for a right answer read as val/accuracy 1.0. A
    top score of exactly 1 is the scale accuracy assumes; above it, said once (start or later)."""
    said = []
    alerts = Alerts(load_config(["+recipe=quickstart"]), said.append)
    alerts.check_once({"val/accuracy": 1.0, "val/score_max": 1.0})
    alerts.check(1, {"val/score_max": 0.5})
    assert said == []
    alerts.check_once({"val/accuracy": 1.0, "val/score_max": 10.0})  # the start's validation
    alerts.check(2, {"val/score_max": 7.5})
    alerts.check(4, {"val/score_max": 10.0})
    assert said == [
        "warning: validation scores reach 10 (val/score_max), above 1: val/accuracy counts a sample right when its "
        "score is at least 1, so here it is not the share answered right; read val/reward_mean, or make reward.fn "
        "score a right answer 1 and a wrong one less"
    ]


def test_a_step_without_episode_counts_is_not_said_even_at_two_episodes():
    """A step that logged no `env/timeouts` or `env/errors` (none ended early) says nothing, also where
    half the step is a single episode (mutation_alerts_progress.json's survivors: a default of 1)."""
    cfg = load_config(
        ["+recipe=quickstart", "env.name=retry", "data.train_batch_size=1", "rollout.n=2"], this_machine=False
    )
    assert episodes_cut(cfg, 3, {}) == {}
    assert list(episodes_cut(cfg, 3, {"env/timeouts": 1.0})) == ["env_timeouts"]


def test_validation_scores_above_one_are_said_and_one_is_not():
    from rlpost.controller.alerts import off_scale

    assert off_scale({"val/score_max": 1.0}) == {} and off_scale({}) == {}
    (said,) = off_scale({"val/score_max": 1.5}).items()
    assert said[0] == "off_scale" and said[1].startswith("warning: validation scores reach 1.5 (val/score_max)")


def test_validation_scores_that_never_reach_one_are_said_where_accuracy_reads_zero():
    """The fifteenth catalogue's t18: a right answer scored 0.9 read as val/accuracy 0 all run, without a word."""
    from rlpost.controller.alerts import off_scale

    (said,) = off_scale({"val/score_max": 0.9, "val/accuracy": 0.0}).items()
    assert said[0] == "under_scale" and said[1] == (
        "warning: no validation score reached 1 (the highest: 0.9, val/score_max): val/accuracy counts a sample "
        "right when its score is at least 1, so it reads 0; if reward.fn scores a right answer below 1, read "
        "val/reward_mean, or make it score a right answer 1"
    )
    assert off_scale({"val/score_max": 0.0, "val/accuracy": 0.0}) == {}  # nothing scored: nothing to read
    assert off_scale({"val/score_max": 0.9, "val/accuracy": 0.25}) == {}  # (not reachable, but not said)


def test_the_sampling_that_makes_samples_alike_is_named_at_its_edges():
    """`alerts.greedy` (the nineteenth catalogue's t22, t134), at the values either side of each edge."""
    from rlpost.controller.alerts import greedy

    said = lambda *overrides: greedy(load_config(["+recipe=quickstart", *overrides]).rollout)  # noqa: E731
    assert said("rollout.top_k=2", "rollout.top_p=0.01") == ""
    assert said("rollout.top_p=0.0099").startswith("rollout.top_p=0.0099 keeps only the likeliest token")
    assert said("algo.name=ppo", "rollout.top_k=1") == (
        "rollout.top_k=1 keeps only the likeliest token, so a prompt's samples are alike (leave it out: off by default)"
    )
    assert said("rollout.temperature=0.05").startswith("rollout.temperature=0.05 makes a prompt's samples alike")


def test_a_step_with_no_loss_token_names_the_filter_only_when_it_removed_every_response():
    nothing = {"actor/entropy": 0.0, "actor/grad_norm": 0.0, "actor/ppo_ratio_max": float("-inf")}
    empty = "warning: no token of step 1 was in the loss (actor/ppo_ratio_max -inf), so nothing trained: every "
    off = load_config(["+recipe=quickstart"])
    assert no_signal(off, 1, {**nothing, "response_length/truncated_frac": 1.0})["no_tokens"].startswith(empty)
    on = load_config(["+recipe=quickstart", "algo.overlong_filter=true"])
    assert no_signal(on, 1, nothing)["no_tokens"].startswith(empty)  # nothing truncated: not the filter
    assert "overlong_filter" in no_signal(on, 1, {**nothing, "response_length/truncated_frac": 1.0})["no_tokens"]


def test_scores_that_reach_1_exactly_or_above_it_are_not_called_under_scale():
    from rlpost.controller.alerts import off_scale

    assert off_scale({"val/score_max": 1.0, "val/accuracy": 0.0}) == {}  # (a failed sample: scored 1, counted wrong)
    assert list(off_scale({"val/score_max": 1.5, "val/accuracy": 0.0})) == ["off_scale"]
    assert list(off_scale({"val/score_max": 0.9, "val/accuracy": 0.0})) == ["under_scale"]


def test_the_tiny_keys_and_the_reward_workers_warnings_read_as_said(monkeypatch):
    from rlpost.config.compose import compose  # (not validated: /m is no folder here)
    from rlpost.controller.alerts import tiny_keys_warning, worker_count_warning

    cfg = compose(["+recipe=quickstart", "model.path=/m", "model.tiny.hidden_size=32", "model.tiny.num_layers=3"])
    assert tiny_keys_warning(cfg) == (
        "warning: model.tiny.hidden_size=32, model.tiny.num_layers=3: read only when model.path=tiny builds the tiny "
        "model, "
        "and model.path=/m: they are not used"
    )
    monkeypatch.setattr("os.cpu_count", lambda: None)  # unknown: taken as one core
    cfg = compose(["+recipe=quickstart", "reward.fn=/tmp/r.py:f", "reward.num_workers=2"])
    assert worker_count_warning(cfg).startswith("warning: reward.num_workers=2 on a machine of 1 CPU cores")
