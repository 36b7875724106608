import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.config import ConfigError, config_docs, load_config

REPO = Path(__file__).resolve().parents[2]


def test_recipe_and_overrides_compose():
    cfg = load_config(["+recipe=quickstart", "trainer.world_size=1", "rollout.n=4", "algo.kl_coef=0.01"])
    assert cfg.trainer.world_size == 1 and cfg.rollout.n == 4 and cfg.algo.kl_coef == 0.01
    assert cfg.data.task == "arithmetic"  # from configs/data/arithmetic.yaml


@pytest.mark.parametrize("overrides, message", [
    (["trainer.wrold_size=3"], "unknown config key 'trainer.wrold_size'; did you mean: trainer.world_size"),
    (["+trainer.foo=1"], "unknown config key 'trainer.foo'"),
    (["rollout.backend=foo"], "rollout.backend='foo' is not allowed; choose one of ['hf', 'vllm']"),
    (["trainer.world_size=abc"], "trainer.world_size"),
    (["+recipe=nope"], "options for recipe: ["),
    (["model=nope"], "options for model: ['hf', 'tiny']"),
    (["algo.loss_agg_mode=sum"], "algo.loss_agg_mode='sum' is not allowed"),
    (["trainer.world_size=3"], "trainer.world_size=3 must divide"),
    (["rollout.n=0"], "rollout.n=0 must be at least 1"),
    (["algo.ppo_mini_batch_size=5"], "algo.ppo_mini_batch_size=5 must divide data.train_batch_size"),
    (["logger.backends=[console,foo]"], "logger.backends contains 'foo'"),
    (["trainer.resume=/nonexistent/ckpt"], "trainer.resume='/nonexistent/ckpt'"),
])
def test_bad_config_names_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", *overrides])
    assert message in str(info.value)


def test_cli_exits_nonzero_before_starting_anything():
    result = subprocess.run([sys.executable, "-m", "rlpost.cli", "train", "+recipe=quickstart",
                             "trainer.wrold_size=1"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert "trainer.wrold_size" in result.stderr and "trainer.world_size" in result.stderr
    assert "Started a local Ray" not in result.stderr + result.stdout


def test_configuration_docs_are_generated_from_the_schema():
    committed = (REPO / "docs" / "configuration.md").read_text()
    assert committed == config_docs(), "docs/configuration.md is stale: run `rlpost doctor --config-docs > docs/configuration.md`"
    assert "`trainer.world_size`" in committed and "`algo.kl_coef`" in committed


def test_cli_bad_data_file_is_a_clean_error(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rlpost.cli", "train", "+recipe=quickstart", "data.task=",
                             f"data.train_files=[{tmp_path / 'missing.jsonl'}]", f"run.dir={tmp_path / 'run'}",
                             f"model.cache_dir={tmp_path / 'cache'}", "model.tiny.warmup_steps=1"],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 2
    assert "missing.jsonl: no such file" in result.stderr and "Traceback" not in result.stderr


def test_cli_bad_reward_fn_is_a_config_error():
    result = subprocess.run([sys.executable, "-m", "rlpost.cli", "train", "+recipe=quickstart", "reward.fn=nope"],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2 and "reward.fn='nope' is not a registered reward" in result.stderr
