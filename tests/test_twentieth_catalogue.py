"""The twentieth catalogue of bad inputs (issue 39), each entry as a test that fails on the code
before its fix: process limits and a full Ray folder refused before Ray, a Ray worker dying as the
actors start said in a line, keys without an upper bound, symbolic-link loops, locks that name no
run, reward functions with keyword-only arguments, compressed files under a text name, the default
data source, standard error unwritable, Slurm's SIGUSR1, the stall timeout's floor, CPU ranks."""

from __future__ import annotations

import errno
import gzip
import os
import resource
import signal
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlpost.config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def loop(tmp_path):
    """A symbolic link in a loop: a -> b -> a."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


@pytest.mark.parametrize(
    "key, value, bound",
    [
        ("model.tiny.seed", "99999999999999999999999", 2**31 - 1),  # t93: torch.manual_seed's raw overflow
        ("data.gym.seed", "99999999999999999999", 2**31 - 1),
        ("model.tiny.eval_samples", "1000000", 1024),  # t94: a silent build of hours
        ("data.max_operands", "1000000000", 1000),  # t96: `rlpost data` silent, its memory growing
        ("data.operands", "100000", 1000),
        ("data.arithmetic_digits", "1000000", 100),
    ],
)
def test_keys_without_an_upper_bound_have_one(key, value, bound):
    with pytest.raises(ConfigError, match=rf"^{key}={value} must be <= {bound}$"):
        load_config(["+recipe=quickstart", f"{key}={value}"])


def test_a_symbolic_link_loop_as_run_dir_or_plotted_run_is_named(loop, tmp_path):
    """t111, t120: a raw `RuntimeError: Symlink loop` from Path.resolve()."""
    from rlpost.controller.run_dir import claim_run_dir
    from rlpost.metrics.plot import plot_runs

    cfg = load_config(["+recipe=quickstart", f"run.dir={loop}"])
    with pytest.raises(
        ConfigError, match=r"cannot use that path \(a symbolic link in a loop\); choose another run.dir"
    ):
        claim_run_dir(cfg, log=lambda *_: None)
    with pytest.raises(ValueError, match=r"a symbolic link in a loop, not a run folder"):
        plot_runs([loop], tmp_path / "x.png")


def test_export_into_a_symbolic_link_loop_is_not_another_export(loop, tmp_path, monkeypatch):
    """t117: the loop was read as another export's claim on --out."""
    import rlpost.controller.export as export_mod

    cfg = SimpleNamespace(model=SimpleNamespace(dtype="float32", path="tiny"))
    monkeypatch.setattr(export_mod, "run_config", lambda run_dir: cfg)
    monkeypatch.setattr(export_mod, "select", lambda run_dir, step, log=print: tmp_path)
    monkeypatch.setattr(export_mod, "check_base_model", lambda cfg, run_dir: None)
    with pytest.raises(FileExistsError, match=r"a symbolic link that leads nowhere \(in a loop"):
        export_mod.export(tmp_path, loop)


@pytest.mark.parametrize("lock", ["folder", "garbage"])
def test_a_lock_that_names_no_run_says_so(tmp_path, lock):
    """t61, t62: "in use by another run (pid None on host None, since 1970-01-01 00:00:00)"."""
    from rlpost.controller.run_dir import claim_run_dir

    path = tmp_path / "run" / "run.lock"
    path.parent.mkdir()
    path.mkdir() if lock == "folder" else path.write_bytes(b"\x00\x00garbage")
    cfg = load_config(["+recipe=quickstart", f"run.dir={tmp_path / 'run'}"])
    what, remove = ("a folder", "rm -r") if lock == "folder" else ("not a lock rlpost wrote", "rm")
    with pytest.raises(ConfigError, match=rf"run.lock is {what}, .* delete it \({remove} {path}\)") as info:
        claim_run_dir(cfg, log=lambda *_: None)
    assert "None" not in str(info.value) and "1970" not in str(info.value)
    assert path.exists()  # nothing deleted


def test_a_keyword_only_argument_points_to_reward_kwargs():
    """t46: `def score(s, *, scale)` was told to read the sample's fields from its one argument."""
    from rlpost.rewards.base import check_call

    def score(s, *, scale, offset=0):
        return scale

    with pytest.raises(TypeError, match=r"give scale with \+reward.kwargs.scale=VALUE$"):
        check_call(score, {}, "f.py:score")
    check_call(score, {"scale": 2}, "f.py:score")

    def three(prompt, response, ground_truth):  # another framework's signature: the sample's fields said
        return 1.0

    with pytest.raises(TypeError, match=r"read sample.prompt"):
        check_call(three, {}, "f.py:three")


@pytest.mark.parametrize("packer, name", [(gzip.compress, "gzip"), (lambda b: b"BZh91AY&SY" + b, "bzip2")])
def test_a_compressed_file_under_a_text_name_is_named(tmp_path, packer, name):
    """t23: a gzip file named .jsonl was "not UTF-8 text; save the file as UTF-8"."""
    from rlpost.data.dataset import DataError, read_text

    path = tmp_path / "rows.jsonl"
    path.write_bytes(packer(b'{"prompt": "1+1=", "ground_truth": "2"}\n' * 50 + b"\xff\xfe"))
    with pytest.raises(DataError, match=rf"rows.jsonl: {name}-compressed, though named .jsonl: decompress it$"):
        read_text(path)


def test_an_unknown_default_data_source_is_said_as_that_key():
    """t153: read as a row's data_source, and the key that set it suggested as the fix."""
    from rlpost.controller.setup import check_reward_routing
    from rlpost.data.dataset import DataError, PromptRow

    rows = [PromptRow([1], "1+1=", "2", "foo")]
    with pytest.raises(DataError, match=r"^data.default_data_source='foo', given to the rows without a data_source"):
        check_reward_routing(rows, "auto", "foo")
    with pytest.raises(DataError, match=r"^reward.fn=auto has no reward function for data_source 'foo'"):
        check_reward_routing(rows, "auto", "")  # a row's own data_source: said as before


def test_standard_error_unwritable_is_said_on_standard_output(tmp_path, monkeypatch, capsys):
    """t122: with `2>/dev/full` a run exited 1 without a word anywhere (stderr's own error went to the
    /dev/null that its failed stream had been pointed at)."""
    import rlpost.cli as cli
    from rlpost.console import SteadyStream

    class Full:  # a stream on a full disk
        def __init__(self):
            self.file = open(tmp_path / "err", "w")  # noqa: SIM115 (its descriptor: pointed at /dev/null)

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def fileno(self):
            return self.file.fileno()

    monkeypatch.setattr(sys, "stderr", SteadyStream(Full(), "stderr"))
    monkeypatch.setattr(cli, "cmd_train", lambda argv: print("a line", file=sys.stderr))
    assert cli.main(["train"]) == 1
    assert capsys.readouterr().out == "rlpost: cannot write to standard error (No space left on device)\n"


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2])
def test_slurms_warning_signals_stop_the_run_as_sigterm_does(signum):
    """t146: SIGUSR1 (Slurm's `--signal=USR1@N`) killed the run at once: no word, no checkpoint."""
    from rlpost.controller.signals import Stopped, StopSignals

    stop = StopSignals()
    try:
        assert signal.getsignal(signum) == stop._note
        with pytest.raises(Stopped) as info:  # before the workers start: at once, as SIGTERM
            os.kill(os.getpid(), signum)
        assert info.value.exit_code == 128 + signum
    finally:
        stop.restore()
    assert signal.getsignal(signum) is signal.SIG_DFL


def test_the_stall_timeout_leaves_the_start_its_time_and_says_what_to_raise(monkeypatch):
    """t148: 10 s, the floor, stopped the quickstart at its weight sync's set-up, with no way on."""
    import rlpost.controller.cluster as cluster

    with pytest.raises(ConfigError, match=r"^cluster.stall_timeout_s=59.0 must be >= 60$"):
        load_config(["+recipe=quickstart", "cluster.stall_timeout_s=59"])
    monkeypatch.setattr(cluster.ray, "wait", lambda refs, num_returns, timeout: ([], refs))
    deadlines = cluster.Deadlines(timeout_s=0.0, log=lambda *_: None)
    with pytest.raises(cluster.Stall, match=r"\(if only slow, raise cluster.stall_timeout_s\)$"):
        cluster.wait_first(["ref"], 0.0, {"ref": "trainer rank 0: init_weight_sync"}, deadlines)


def test_cpu_ranks_beyond_the_cores_are_refused_before_ray(monkeypatch):
    """t164: 64 ranks on 2 cores started and said nothing but Ray's warnings for minutes."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"^trainer.world_size=64: .* 2 cores; give at most 16"):
        load_config(["+recipe=quickstart", "trainer.world_size=64"])
    load_config(["+recipe=quickstart", "trainer.world_size=16"])
    load_config(["+recipe=quickstart", "trainer.world_size=64", "cluster.address=auto"])  # a cluster's cores


def test_process_limits_are_raised_or_refused_before_ray(monkeypatch):
    """t55-t57: `ulimit -n 64` killed Ray's raylet as the actors started (a raw traceback); `ulimit -f`
    and `ulimit -v` were said as a killed or busy start, "start the run again"."""
    from rlpost import limits as ray_checks
    from rlpost.limits import LimitError

    inf = resource.RLIM_INFINITY
    limits = {which: (inf, inf) for which in ray_checks.LIMITS} | {resource.RLIMIT_NOFILE: (64, 100000)}
    monkeypatch.setattr(ray_checks.resource, "getrlimit", lambda which: limits[which])
    monkeypatch.setattr(ray_checks.resource, "setrlimit", lambda which, pair: limits.__setitem__(which, pair))
    ray_checks.check_limits()
    assert limits[resource.RLIMIT_NOFILE] == (65536, 100000)  # the soft limit raised, as launchers do
    limits[resource.RLIMIT_NOFILE] = (64, 64)
    with pytest.raises(LimitError, match=r"open files limit \(ulimit -n\) is 64, and its hard limit 64"):
        ray_checks.check_limits()
    limits[resource.RLIMIT_NOFILE] = (1024, 1024)
    limits[resource.RLIMIT_FSIZE] = (200 * 1024, 200 * 1024)
    with pytest.raises(LimitError, match=r"\(ulimit -f\) is 200, .*ulimit -f 1048576 \(KiB\), or unlimited"):
        ray_checks.check_limits()
    limits[resource.RLIMIT_FSIZE] = (100, inf)  # a soft limit alone: raised to what a run needs, no further
    limits[resource.RLIMIT_AS] = (3 << 30, 3 << 30)
    with pytest.raises(LimitError, match=r"address space limit \(ulimit -v\) is 3145728, and its hard limit 3145728"):
        ray_checks.check_limits()
    assert limits[resource.RLIMIT_FSIZE] == (1 << 30, inf)
    limits[resource.RLIMIT_AS] = (100 << 30, inf)  # the user's own soft limit above the need: kept
    ray_checks.check_limits()
    assert limits[resource.RLIMIT_AS] == (100 << 30, inf) and limits[resource.RLIMIT_FSIZE] == (1 << 30, inf)


def test_a_full_ray_folder_is_refused_before_ray(tmp_path, monkeypatch):
    """t59b: /tmp/ray a full file system of its own, below a /tmp with room: Ray's start timed out."""
    from rlpost.controller import ray_checks

    (tmp_path / "ray").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setattr(ray_checks, "check_limits", lambda: None)
    free = lambda path: SimpleNamespace(free=0 if str(path).endswith("/ray") else 1 << 40)  # noqa: E731
    monkeypatch.setattr(ray_checks.shutil, "disk_usage", free)
    with pytest.raises(ConfigError, match=r"has 0.0 MiB free"):
        ray_checks.check_ray_can_start()


def test_ray_that_did_not_start_quotes_its_last_error(tmp_path):
    """t57: raylet.out said why (an mmap that failed); rlpost guessed a killed or busy start."""
    from rlpost.controller.cluster import last_ray_error

    (tmp_path / "raylet.out").write_text(
        "[2026-11-29 11:10:05,001 I 897 897] main.cc:1: starting\n"
        "[2026-11-29 11:10:06,227 E 897 897] dlmalloc.cc:215: mmap failed with error: Cannot allocate memory\n"
        "[2026-11-29 11:10:06,300 I 897 897] main.cc:2: exiting\n"
    )
    said = "raylet.out: dlmalloc.cc:215: mmap failed with error: Cannot allocate memory"
    assert last_ray_error(str(tmp_path), datetime(2026, 11, 29, 11, 10)) == said
    assert last_ray_error(str(tmp_path), datetime(2026, 11, 29, 11, 11)) is None  # another run's, before this one
    assert last_ray_error(str(tmp_path / "none"), datetime(2026, 11, 29, 11, 10)) is None


def test_a_ray_worker_dying_as_the_actors_start_is_said_in_a_line(monkeypatch):
    """t55: an ActorDiedError from the weight sync's set-up left the run as a 45-line traceback. An
    error raised in an actor's own code (a RayTaskError) keeps its traceback, which names it."""
    import ray

    import rlpost.controller.run as run
    from rlpost.controller.run import WorkersDied

    raised = [ray.exceptions.ActorDiedError()]

    def dies(*args, **kwargs):
        raise raised[0]

    monkeypatch.setattr(run, "Controller", dies)
    cfg = load_config(["+recipe=quickstart"])
    with pytest.raises(WorkersDied, match=r"died while its actors started \(ActorDiedError: The actor died unexpected"):
        run.train(cfg, log=lambda *_: None)
    raised[0] = ray.exceptions.RayError("an error of the actor's own code")
    with pytest.raises(ray.exceptions.RayError, match="actor's own code"):
        run.train(cfg, log=lambda *_: None)
