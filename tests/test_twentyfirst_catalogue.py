"""The twenty-first catalogue of bad inputs (issue 39), each entry fixed here as a test that fails on
the code before: process limits checked before torch loads (and `ulimit -d`, `ulimit -s`), thread
counts and the start's pass@k without an upper bound, locks naming pids no run can have, the CPU
rule counting the cores the process may use, weight decay past any use."""

from __future__ import annotations

import json
import os
import resource

import pytest

from rlpost.config import ConfigError, load_config


@pytest.mark.parametrize("which, flag", [(resource.RLIMIT_DATA, "ulimit -d"), (resource.RLIMIT_STACK, "ulimit -s")])
def test_limits_are_checked_before_torch_loads(monkeypatch, capsys, which, flag):
    """t41, t42: `ulimit -d/-v 300000` ended in a raw MemoryError or ImportError as torch loaded (the
    check came after); t47: `ulimit -s 100` made Ray's workers crash, and rlpost said nothing."""
    import rlpost.cli as cli
    from rlpost import limits

    low = {w: (resource.RLIM_INFINITY, resource.RLIM_INFINITY) for w in limits.LIMITS}
    low[resource.RLIMIT_NOFILE] = (4096, 4096)
    low[which] = (100 * 1024, 100 * 1024)
    monkeypatch.setattr(limits.resource, "getrlimit", lambda w: low[w])
    monkeypatch.setattr(limits.resource, "setrlimit", lambda w, pair: pytest.fail("a hard limit cannot be passed"))
    assert cli.cmd_train(["+recipe=quickstart"]) == 2
    assert f"limit ({flag}) is 100, and its hard limit 100" in capsys.readouterr().err


@pytest.mark.parametrize(
    "key, value, bound",
    [
        ("model.tiny.warmup_threads", "100000", 1024),  # t131: torch crashed (exit 139), no word
        ("cluster.num_threads", "100000", 1024),  # t132: "Ray did not start", then a crash
        ("trainer.start_pass_k", "100000", 1024),  # t150: sampled silently, SIGTERM took a minute
        ("trainer.optim.weight_decay", "1000000000.0", 1),  # t11: the collapse blamed on the learning rate
    ],
)
def test_keys_without_an_upper_bound_have_one(key, value, bound):
    with pytest.raises(ConfigError, match=rf"^{key}={value} must be <= {bound}$"):
        load_config(["+recipe=quickstart", f"{key}={value}"])


@pytest.mark.parametrize("pid", [0, -1, True, 2**40, "12"])
def test_a_lock_naming_a_pid_no_run_can_have_names_no_run(tmp_path, pid):
    """t103-t106: pid 0, -1 and true were "in use by another run" (os.kill took them: the group, every
    process, pid 1); 2**40 ended in a raw OverflowError."""
    from rlpost.controller.run_dir import claim_run_dir

    (tmp_path / "run.lock").write_text(json.dumps({"pid": pid, "host": "here", "since": 0}))
    cfg = load_config(["+recipe=quickstart", f"run.dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"run.lock is not a lock rlpost wrote, so no run that holds the folder"):
        claim_run_dir(cfg, log=lambda *_: None)


def test_the_cpu_rule_counts_the_cores_the_process_may_use(monkeypatch):
    """t133: `taskset -c 0` with 16 ranks was taken: os.cpu_count() counts the machine's cores."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    with pytest.raises(ConfigError, match=r"^trainer.world_size=16: .* which has 1 cores; give at most 8"):
        load_config(["+recipe=quickstart", "trainer.world_size=16"])
