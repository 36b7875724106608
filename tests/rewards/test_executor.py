"""Rewards as untrusted code: each way a reward function can fail scores `error_score`, is
counted by its kind with its traceback, and leaves the other samples and the pool working."""

import time

import pytest

from rlpost.rewards import RewardInput
from rlpost.rewards.executor import RewardPool

pytestmark = pytest.mark.timeout(120)

USER = '''
import os, signal, time

def length(sample):
    return len(sample.response)

def misbehave(sample):
    """What the response says: the way this sample fails."""
    what = sample.response
    if what == "raise":
        raise RuntimeError("boom in the user's code")
    if what == "sleep":
        time.sleep(3600)
    if what == "swallow":  # a bare except must not catch the timeout
        try:
            time.sleep(3600)
        except Exception:
            return 1.0
    if what == "blocked":  # the alarm cannot reach it: the parent kills the worker
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        time.sleep(3600)
    if what == "exit":
        os._exit(3)
    if what == "memory":
        return len(bytearray(10 * 2**30))
    if what == "nan":
        return float("nan")
    if what == "text":
        return "1.0"
    if what == "bool":
        return True
    return 1.0
'''


def sample(response, truth="7", source="arithmetic"):
    return RewardInput("3+4=", response, truth, source)


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "user_reward.py"
    path.write_text(USER)
    return path


def pool(spec, workers=2, timeout_s=1.0, memory_mb=1024, error_score=-1.0, kwargs=None):
    return RewardPool(spec, kwargs or {}, workers, timeout_s, memory_mb, error_score)


def test_scores_come_back_in_sample_order_from_every_worker(user_file):
    p = pool(f"{user_file}:length", workers=3)
    try:
        samples = [sample("x" * i) for i in range(10)]
        out = p.score(samples)
        assert out.scores == [float(i) for i in range(10)] and out.counts["errors"] == 0
        assert p.score([]).scores == []
    finally:
        p.close()


def test_auto_routes_by_data_source_and_counts_an_unknown_source():
    p = pool("auto")
    try:
        out = p.score([sample("7"), sample("#### 7", source="gsm8k"), sample("7", source="mystery")])
        assert out.scores == [1.0, 1.0, -1.0] and out.counts["errors"] == 1 and out.error_rows == [2]
        assert "mystery" in out.first_error
        assert sum(proc is not None for proc in p.pool.procs) == 1  # started for the unknown source only
    finally:
        p.close()


def test_trusted_scorers_run_here_and_start_no_process():
    p = pool("arithmetic")
    try:
        out = p.score([sample("7"), sample("8"), sample(" 7 ")])
        assert out.scores == [1.0, 0.0, 1.0] and out.counts["errors"] == 0
        assert p.pool.procs == [None, None]
    finally:
        p.close()


def test_every_kind_of_failure_is_scored_counted_and_contained(user_file):
    p = pool(f"{user_file}:misbehave", workers=2, timeout_s=1.0)
    try:
        kinds = ["ok", "raise", "sleep", "swallow", "ok", "exit", "memory", "nan", "text", "bool", "blocked", "ok"]
        start = time.monotonic()
        out = p.score([sample(k) for k in kinds])
        took = time.monotonic() - start
        want = [1.0 if k == "ok" else -1.0 for k in kinds]
        assert out.scores == want
        assert out.counts == {"errors": 9, "timeouts": 3, "bad_values": 3, "crashes": 1}
        assert sorted(out.error_rows) == [i for i, k in enumerate(kinds) if k != "ok"]
        assert out.first_error.startswith("sample 1: Traceback") and "boom in the user's code" in out.first_error
        assert took < 30, took  # each hang costs its timeout (plus the grace where the parent kills)
        again = p.score([sample("ok"), sample("ok")])  # the dead and hung workers were replaced
        assert again.scores == [1.0, 1.0] and again.counts["errors"] == 0
    finally:
        p.close()


def test_memory_cap_turns_a_huge_allocation_into_an_error(user_file):
    p = pool(f"{user_file}:misbehave", workers=1, memory_mb=512)
    try:
        out = p.score([sample("memory"), sample("ok")])
        assert out.scores == [-1.0, 1.0] and "MemoryError" in out.first_error
    finally:
        p.close()


def test_kwargs_reach_an_explicit_function_only():
    p = pool("gsm8k", kwargs={"method": "flexible"})
    try:
        assert p.score([sample("so 7.", source="gsm8k"), sample("it is 8")]).scores == [1.0, 0.0]
    finally:
        p.close()


def test_the_alarm_interrupts_an_item_only_while_it_runs():
    """The worker arms the alarm per item and disarms it per chunk: one that rings after an item
    returned must do nothing, one that rings during an item ends that item as a timeout."""
    import signal

    from rlpost.rewards.executor import _alarm, _call_one

    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        assert _call_one(lambda x: x + 1, 1, 0.05, "reward.timeout_s") == (2, "ok", "")
        time.sleep(0.2)  # the alarm rings here, between items
        value, kind, message = _call_one(lambda x: time.sleep(5), 1, 0.05, "reward.timeout_s")
        assert (value, kind) == (None, "timeouts") and "reward.timeout_s=0.05" in message
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
