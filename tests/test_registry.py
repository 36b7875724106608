"""The one registry type (rlpost/registry.py): registering, finding, refusing, and the messages an
unknown name gets; and that every registry of the project is one, the config's choices its names."""

import ast
from pathlib import Path

import pytest
import torch

from rlpost.algos.advantages import ADVANTAGES, TOKEN_REWARDS
from rlpost.algos.algorithms import ALGORITHMS
from rlpost.algos.filters import BATCH_FILTERS
from rlpost.algos.losses import KL_ESTIMATORS, LOSS_AGG_MODES, kl_penalty
from rlpost.algos.policy_loss import POLICY_LOSSES
from rlpost.config import ConfigError, iter_fields, load_config
from rlpost.data.tasks import TASKS
from rlpost.envs import ENVS, PARSERS
from rlpost.metrics.trackers import TRACKERS, Trackers
from rlpost.registry import Registry, UnknownName
from rlpost.rewards import REWARDS, get_reward_fn
from rlpost.rewards.base import TRUSTED

REGISTRY = Path(__file__).resolve().parent.parent / "rlpost" / "registry.py"


def test_register_by_decorator_or_call_then_get_in_registration_order():
    colours = Registry("colour", key="paint.colour")

    @colours.register("red")
    def red():
        return "r"

    assert colours.register("blue", "b") == "b" and colours.register("none", None) is None
    assert colours.get("red") is red and colours["blue"] == "b" and colours.get("none") is None
    assert colours.names() == ["red", "blue", "none"] == list(colours)
    assert colours.items() == [("red", red), ("blue", "b"), ("none", None)]
    assert "red" in colours and "green" not in colours


def test_a_name_registered_twice_is_refused_and_the_first_stays():
    colours = Registry("colour")
    colours.register("red", 1)
    with pytest.raises(ValueError, match=r"^colour 'red' is registered twice$"):
        colours.register("red", 2)
    with pytest.raises(ValueError, match="registered twice"):
        colours.register("red")(lambda: None)
    assert colours.get("red") == 1
    files = Registry("parser", replace=True)  # filled by a user's file, which may run again
    files.register("mine", 1)
    assert files.register("mine", 2) == 2 and files.get("mine") == 2


def test_an_unknown_name_names_the_key_suggests_the_closest_and_lists_every_name():
    colours = Registry("colour", key="paint.colour", others="`#rrggbb`")
    for name in ("red", "green", "blue"):
        colours.register(name, name)
    with pytest.raises(UnknownName) as info:
        colours.get("gren")
    assert str(info.value) == (
        "paint.colour='gren' is not a registered colour (did you mean 'green'?); "
        "choose one of ['red', 'green', 'blue'] (or `#rrggbb`)"
    )
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)  # either catch takes it
    assert (
        colours.unknown("zzz")
        == "paint.colour='zzz' is not a registered colour; choose one of "
        + str(["red", "green", "blue"])
        + " (or `#rrggbb`)"
    )
    assert Registry("colour").unknown("x") == "'x' is not a registered colour; choose one of []"


def test_flags_are_sets_that_later_registrations_fill():
    scorers = Registry("scorer")
    trusted = scorers.flagged("trusted")
    scorers.register("mine", len, trusted=True)
    scorers.register("theirs", len)
    assert trusted == {"mine"} and scorers.flagged("trusted") is trusted and scorers.flagged("other") == set()


def test_registry_imports_nothing_of_rlpost():
    tree = ast.parse(REGISTRY.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m.split(".")[0] == "rlpost" for m in imported), imported
    assert len(REGISTRY.read_text().splitlines()) <= 90


# ----------------------------------------------------------------------- the project's registries
PROJECT = {
    "algorithm": (
        ALGORITHMS,
        {"grpo", "ppo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "dapo", "gspo", "cispo"},
    ),
    "advantage estimator": (ADVANTAGES, {"grpo", "rloo", "reinforce_pp", "gae", "reinforce_pp_baseline"}),
    "policy loss": (POLICY_LOSSES, {"ppo", "gspo", "cispo"}),
    "batch filter": (BATCH_FILTERS, {"none", "dynamic_sampling"}),
    "KL estimator": (KL_ESTIMATORS, {"k1", "k2", "k3"}),
    "loss aggregation": (LOSS_AGG_MODES, {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"}),
    "reward": (REWARDS, {"arithmetic", "gsm8k", "last_number", "answer_line", "reasoning_gym", "math_verify"}),
    "environment": (ENVS, {"calculator", "retry", "python"}),
    "tool parser": (PARSERS, {"hermes"}),
    "offline task": (TASKS, {"arithmetic", "multiply", "sums_chat", "sums_steps", "reasoning_gym"}),
    "tracker": (TRACKERS, {"console", "jsonl", "tensorboard", "wandb"}),
}


@pytest.mark.parametrize("kind", PROJECT)
def test_every_registry_of_the_project_is_one(kind):
    registry, names = PROJECT[kind]
    assert isinstance(registry, Registry) and registry.kind == kind
    assert names <= set(registry.names())


def test_the_metadata_flags_are_the_registries_own_sets():
    assert TOKEN_REWARDS is ADVANTAGES.flagged("token_rewards") and {"reinforce_pp", "gae"} == TOKEN_REWARDS
    assert TRUSTED is REWARDS.flagged("trusted") and {"arithmetic", "gsm8k", "last_number"} <= TRUSTED
    assert not {"reasoning_gym", "math_verify"} & TRUSTED


def test_the_configs_choices_are_the_registries_names():
    fields = dict(iter_fields())
    for key, registry in [
        ("algo.name", ALGORITHMS),
        ("algo.kl_estimator", KL_ESTIMATORS),
        ("algo.loss_agg_mode", LOSS_AGG_MODES),
    ]:
        assert fields[key].metadata["choices"] is registry and registry.key == key
    assert fields["data.task"].metadata["choices"] == ("", *TASKS.names())
    for registry, key in [(ENVS, "env.name"), (PARSERS, "env.tool_parser"), (TRACKERS, "logger.backends")]:
        assert registry.key == key  # checked by a rule of rlpost/config/rules.py


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "algo.name=grop",
            "algo.name='grop' is not a registered algorithm (did you mean 'grpo'?); choose one of ['grpo', 'ppo', "
            "'rloo', 'reinforce_pp', 'reinforce_pp_baseline', 'dapo', 'gspo', 'cispo']",
        ),
        ("algo.kl_estimator=k33", "algo.kl_estimator='k33' is not a registered KL estimator (did you mean 'k3'?)"),
        ("algo.loss_agg_mode=token_mean", "algo.loss_agg_mode='token_mean' is not a registered loss aggregation"),
        (
            "logger.backends=[console,jsonll]",
            "logger.backends='jsonll' is not a registered tracker (did you mean 'jsonl'?)",
        ),
        ("env.name=calculater", "env.name='calculater' is not a registered environment (did you mean 'calculator'?)"),
        ("env.tool_parser=hermez", "env.tool_parser='hermez' is not a registered tool parser (did you mean 'hermes'?)"),
    ],
)
def test_a_config_with_an_unknown_name_gets_the_registrys_did_you_mean(override, message):
    extra = ["env.name=calculator"] if override.startswith("env.tool_parser") else []
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", *extra, override])
    assert message in str(info.value)


def test_lookups_at_run_time_get_the_same_message(tmp_path):
    with pytest.raises(KeyError, match=r"^reward.fn='gsm8' is not a registered reward \(did you mean 'gsm8k'\?\)"):
        get_reward_fn("gsm8")
    with pytest.raises(ValueError, match=r"^logger.backends='jsonll' is not a registered tracker"):
        Trackers(["jsonll"], tmp_path)
    with pytest.raises(ValueError, match=r"^algo.kl_estimator='k4' is not a registered KL estimator"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    with pytest.raises(KeyError, match=r"^algo.name='gspo2' is not a registered algorithm \(did you mean 'gspo'"):
        ALGORITHMS.get("gspo2")
