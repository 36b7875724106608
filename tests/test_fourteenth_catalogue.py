"""Faults the fourteenth bad-input catalogue found (tried by someone who did not write the code, on
89e1a62) that have no better home: each test fails on the code before its fix. The others are
beside the code they test: t01 in tests/controller/test_alerts.py and test_start_pass_k.py, t02 in
tests/test_silent_results.py, t03-t05 in tests/config/test_command_line.py, t06-t08 in
tests/metrics/test_plot.py, t09 in tests/data/test_dataset.py, t10 in
tests/controller/test_checkpoint.py, t13-t15 and t24-t26 in tests/config/test_config.py, t27 in
tests/metrics/test_row_file.py, t29 in tests/controller/test_progress.py, t30 in tests/metrics/test_plot.py."""

import pytest

from rlpost.cli import main
from rlpost.config import ConfigError, load_config


def test_rlpost_data_refuses_the_data_keys_its_task_does_not_read(tmp_path, capsys):
    """t20: `rlpost data arithmetic data.max_prompt_length=2 data.shuffle=false` wrote every row and
    ignored both (a run would have dropped every prompt); the keys the task reads still work."""
    out = tmp_path / "d"
    assert main(["data", "arithmetic", "--out", str(out), "data.max_prompt_length=2", "data.shuffle=false"]) == 2
    assert capsys.readouterr().err == (
        "rlpost data: data.max_prompt_length=2, data.shuffle=false: arithmetic's rows do not read it (they read "
        "data.arithmetic_digits, data.val_size)\n"
    )
    assert not out.exists()
    assert main(["data", "arithmetic", "--out", str(out), "data.val_size=8"]) == 0
    assert len((out / "val.jsonl").read_text().splitlines()) == 8


def test_the_reward_pools_keys_with_rlposts_own_scorer_are_refused_before_the_actors():
    """t16: reward.timeout_s=0.001 reward.num_workers=64 with reward.fn=arithmetic were taken and
    ignored (rlpost's scorers run in the controller). A user's function reads them: not refused."""
    from rlpost.controller.reward_checks import check_reward_values

    cfg = load_config(["+recipe=quickstart", "reward.fn=arithmetic", "reward.timeout_s=0.001", "reward.num_workers=64"])
    with pytest.raises(ConfigError) as info:
        check_reward_values(cfg, [])
    assert str(info.value) == (
        "reward.num_workers=64, reward.timeout_s=0.001: read only by the reward pool, which runs your own functions, "
        "and reward.fn=arithmetic is rlpost's own scorer (run in the controller): leave them out"
    )
    check_reward_values(load_config(["+recipe=quickstart", "reward.fn=arithmetic"]), [])
