"""Faults the tenth bad-input catalogue found (tried by someone who did not write the code, on
19f987b): each test fails on the code before its fix."""

import pytest

from rlpost.config import ConfigError, load_config


def test_cluster_address_auto_with_no_cluster_is_named_by_its_key(monkeypatch):
    """t13: Ray's 42-line ConnectionError traceback, whose advice names `--address` and RAY_ADDRESS."""
    from rlpost.controller import cluster

    def no_cluster(**kwargs):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to.")

    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster, "init_ray", no_cluster)
    cfg = load_config(["+recipe=quickstart", "cluster.address=auto"])
    with pytest.raises(ConfigError, match=r"^cluster.address='auto': no running Ray cluster found \(Could not find any "
                       r"running Ray instance\); start one with `ray start --head`"):  # fmt: skip
        cluster.start_ray(cfg, log=lambda *_: None)


def test_an_environments_tool_that_is_a_plain_function_is_named_with_what_to_do(tmp_path):
    """t36: `return [t.schema for t in env.tools]` raised AttributeError from setup.py."""
    from rlpost.controller.setup import env_tools

    (tmp_path / "env.py").write_text(
        "from rlpost.envs import EnvStep, tool\n\n"
        "@tool\ndef calc(expression: str) -> str:\n    return expression\n\n"
        "def plain(expression: str) -> str:\n    return expression\n\n"
        "class Env:\n    tools = [calc, plain]\n\n    def step(self, turn):\n        return EnvStep(done=True)\n\n"
        "def make(row, options):\n    return Env()\n"
    )
    cfg = load_config(["+recipe=quickstart", f"env.name={tmp_path}/env.py:make"])
    row = {"prompt": "1+1=", "ground_truth": "2", "data_source": "arithmetic"}
    with pytest.raises(ConfigError, match=rf"^env.name={tmp_path}/env.py:make: its tools\[1\] \(plain\) is a function "
                       r"without a schema, not a tool; decorate the function with @rlpost.envs.tool$"):  # fmt: skip
        env_tools(cfg)(row)


def test_a_standard_output_that_cannot_be_written_is_said_in_one_line():
    """t59: `rlpost doctor --config-docs > /dev/full` ended in a raw OSError traceback from console.py."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "rlpost.cli", "doctor", "--config-docs"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == "rlpost: cannot write to standard output (No space left on device)\n"


def test_two_recipes_are_refused_without_a_line_that_says_the_last_is_used(capsys):
    """t61: "recipe given 2 times (quickstart, ppo): the last, ppo, is used", then the refusal."""
    from rlpost.cli import main

    assert main(["train", "+recipe=quickstart", "+recipe=ppo", "--cfg", "job"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "rlpost: config error: one recipe a run: give +recipe=NAME once (its keys can be overridden one by one: "
        "KEY=VALUE)\n"
    )


def test_resume_auto_without_a_run_folder_is_refused_before_one_is_made(tmp_path, monkeypatch):
    """t46: a new dated folder was made, and "no complete checkpoint in <it>, starting fresh" said."""
    from rlpost.controller.run_dir import claim_run_dir

    monkeypatch.chdir(tmp_path)
    cfg = load_config(["+recipe=quickstart", "trainer.resume=auto"])
    said = r"^trainer.resume=auto looks for the newest checkpoint in run.dir, and run.dir is not set .*: give "
    with pytest.raises(ConfigError, match=said + r"run.dir=<the run's folder>, or leave trainer.resume out$"):
        claim_run_dir(cfg, log=lambda *_: None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "recipe, setting, said",
    [
        ("ppo", "algo.norm_adv_by_std=false", "algo.norm_adv_by_std=False is read only by the grpo and rloo "
         "advantages; algo.name=ppo takes gae's"),
        ("quickstart", "algo.gamma=0.9", "algo.gamma=0.9 is read only by the reinforce_pp and gae advantages"),
        ("quickstart", "algo.lam=0.9", "algo.lam=0.9 is read only by the gae advantages; algo.name=grpo takes grpo's"),
        ("reinforce_pp", "algo.lam=0.9", "algo.lam=0.9 is read only by the gae advantages"),
    ],
)  # fmt: skip
def test_a_key_the_algorithms_advantages_do_not_read_is_refused(recipe, setting, said):
    """t54, t55: `algo.norm_adv_by_std=false` under PPO, `algo.gamma`/`algo.lam` under GRPO changed nothing,
    the run bit-identical to one without them, and nothing was said."""
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load_config([f"+recipe={recipe}", setting])


ALLOWED = [("ppo", "algo.lam=0.9"), ("ppo", "algo.gamma=0.99"), ("reinforce_pp", "algo.gamma=0.99"),
           ("rloo", "algo.norm_adv_by_std=false")]  # fmt: skip


@pytest.mark.parametrize("recipe, setting", ALLOWED)
def test_the_keys_the_advantages_read_stay_allowed(recipe, setting):
    load_config([f"+recipe={recipe}", setting])


def test_a_checkpoints_folder_that_cannot_be_written_is_refused_at_the_start(tmp_path, monkeypatch):
    """t43: it failed at the first save, after the actors started and a step trained."""
    import tempfile

    from rlpost.controller.run_dir import check_writable, claim_run_dir, release_run_dir

    (tmp_path / "checkpoints").mkdir()
    check_writable(tmp_path / "checkpoints")  # writable: nothing said
    real = tempfile.TemporaryFile

    def refused(*args, dir=None, **kwargs):
        if dir is not None and str(dir).endswith("checkpoints"):
            raise PermissionError(1, "Operation not permitted")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    cfg = load_config(["+recipe=quickstart", f"run.dir={tmp_path}", "trainer.save_every=1"])
    with pytest.raises(ConfigError, match=rf"^{tmp_path}/checkpoints: cannot write there \(Operation not permitted\), "
                       r"and trainer.save_every writes the run's checkpoints there"):  # fmt: skip
        claim_run_dir(cfg, log=lambda *_: None)
    cfg = load_config(["+recipe=quickstart", f"run.dir={tmp_path}", "trainer.save_every=0"])
    release_run_dir(claim_run_dir(cfg, log=lambda *_: None))  # no checkpoints to write: not asked


def test_a_reward_model_length_below_a_samples_is_said_before_the_first_step():
    """t56: `reward.model.max_length=1` scored every sample's first token, and its constant score trained."""
    from rlpost.controller.alerts import setting_warnings

    cfg = load_config(["+recipe=grpo_rm", "reward.model.max_length=1"])
    longest = cfg.data.max_prompt_length + cfg.rollout.max_response_length
    said = [w for w in setting_warnings(cfg) if "reward.model.max_length" in w]
    assert said == [
        f"warning: reward.model.max_length=1 is below a sample's {longest} tokens (data.max_prompt_length + "
        "rollout.max_response_length, the policy's): the reward model reads each sample cut to its first 1 tokens "
        "of its own, the end of the response dropped"
    ]
    cfg = load_config(["+recipe=grpo_rm", f"reward.model.max_length={longest}"])
    assert not [w for w in setting_warnings(cfg) if "reward.model.max_length" in w]


def test_a_builtin_rewards_keyword_value_is_tried_before_the_actors():
    """t77: keys were checked, values not: every sample of step 1 failed, and a 1-step run exited 0."""
    from rlpost.controller.reward_checks import check_builtin_kwargs

    with pytest.raises(ConfigError, match=r"^reward.kwargs=\{'method': 'bogus'\}: reward.fn=gsm8k refuses them on a "
                       r"first try: gsm8k method must be 'strict' or 'flexible', got 'bogus'$"):  # fmt: skip
        check_builtin_kwargs("gsm8k", {"method": "bogus"})
    check_builtin_kwargs("gsm8k", {"method": "flexible"})  # a value it takes


def test_a_link_listed_beside_its_file_is_named_as_the_same_file(tmp_path):
    """t72: "lists link.jsonl more than once", though the list held it once."""
    (tmp_path / "base.jsonl").write_text('{"prompt": "1+1=", "ground_truth": "2"}\n')
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "base.jsonl")
    files = f"data.train_files=[{tmp_path}/base.jsonl,{tmp_path}/link.jsonl]"
    with pytest.raises(ConfigError, match=rf"^data.train_files lists {tmp_path}/link.jsonl and {tmp_path}/base.jsonl, "
                       r"the same file \(its rows trained on as many times\): list it once$"):  # fmt: skip
        load_config(["+recipe=quickstart", "data.task=", files])


def test_a_plot_it_cannot_write_is_said_in_one_line(monkeypatch, capsys):
    """t45: a 34-line PIL traceback ending in PermissionError, no hint of --out."""
    from rlpost import cli
    from rlpost.metrics import plot

    def refused(paths, out=None):
        raise PermissionError(1, "Operation not permitted", "/runs/a/compare.png")

    monkeypatch.setattr(plot, "plot_runs", refused)
    assert cli.main(["plot", "/runs/a", "/runs/b"]) == 1
    assert capsys.readouterr().err == (
        "rlpost plot: cannot write /runs/a/compare.png (Operation not permitted): give --out PATH somewhere writable\n"
    )


def test_an_environment_factory_that_returns_its_class_is_named_at_the_start(tmp_path):
    """t35: it passed the start; every episode then failed and the run trained as a single-turn one."""
    from types import SimpleNamespace

    from rlpost.controller.setup import check_env

    (tmp_path / "env.py").write_text(
        "from rlpost.envs import EnvStep\n\nclass Env:\n    tools = []\n\n    def step(self, turn):\n"
        "        return EnvStep(done=True)\n\ndef make(row, options):\n    return Env\n"
    )
    cfg = load_config(["+recipe=quickstart", f"env.name={tmp_path}/env.py:make"])
    row = SimpleNamespace(prompt_text="1+1=", ground_truth="2", data_source="arithmetic")
    with pytest.raises(ConfigError, match=r": the factory returned the class Env, not an environment made from it: "
                       r"return Env\(...\)$"):  # fmt: skip
        check_env(cfg, row)


@pytest.mark.parametrize("env_mode, said", [("online", True), ("offline", False), (None, False)])
def test_a_wandb_mode_in_the_environment_that_the_setting_overrides_is_said(
    tmp_path, monkeypatch, capsys, env_mode, said
):
    """t17: WANDB_MODE=online was overridden by logger.wandb_mode=offline without a word, and wandb's own
    line then told the user to set WANDB_MODE=online."""
    import sys
    from types import SimpleNamespace

    from rlpost.metrics.trackers import WandbTracker

    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(init=lambda **kwargs: kwargs))
    if env_mode:
        monkeypatch.setenv("WANDB_MODE", env_mode)
    else:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    assert WandbTracker(tmp_path, "rlpost", "offline", {}).run["mode"] == "offline"
    expected = (
        "warning: WANDB_MODE=online is set, and logger.wandb_mode=offline decides: set logger.wandb_mode=online\n"
    )
    assert capsys.readouterr().out == (expected if said else "")


def test_a_plot_out_without_an_extension_says_the_file_it_wrote():
    """t51 (the ninth's n68 by another way): `--out /x/p51` wrote p51.png and said /x/p51."""
    from pathlib import Path

    from rlpost.metrics.plot import _target

    default = Path("/runs/a/curves.png")
    assert _target("/x/p51", default) == Path("/x/p51.png")
    assert _target("/x/p51.svg", default) == Path("/x/p51.svg")
    assert _target("/x/", default) == Path("/x/curves.png") and _target(None, default) == default


@pytest.mark.parametrize("verbose", [False, True])
def test_vllms_loading_bar_follows_logger_verbose_and_its_tokenizer_lines_are_not_shown(verbose):
    """t69: with `logger.verbose=false` vLLM still drew its "Loading safetensors checkpoint
    shards" bar and said "Using None for EOS token id" (rlpost tokenizes and stops on the EOS id
    itself), as if EOS were broken."""
    import logging

    pytest.importorskip("vllm")
    from rlpost.rollout.vllm_engine import engine_kwargs, prepare_environment

    kwargs = engine_kwargs("cpu", 0.5, False, 0.0, False, 1024, 1, None, verbose)
    assert kwargs["use_tqdm_on_load"] is verbose
    prepare_environment("cpu", 1)
    base = logging.getLogger("vllm.renderers.base")

    def shown(message: str) -> bool:
        return base.filter(logging.LogRecord(base.name, logging.WARNING, "", 0, message, None, None))

    assert not shown("Using None for EOS token id because tokenizer is not initialized")
    assert not shown("Using None for BOS token id because tokenizer is not initialized")
    assert shown("any other warning")
