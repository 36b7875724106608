"""Rewards as untrusted code: each way a reward function can fail scores `error_score`, is
counted by its kind with its traceback, and leaves the other samples and the pool working."""

import time

import pytest

from rlpost.rewards import RewardInput
from rlpost.rewards.pool import RewardPool

pytestmark = pytest.mark.timeout(120)

USER = '''
import os, signal, time

def length(sample):
    return len(sample.response)

def slow_prompt(sample):
    if sample.prompt.startswith("slow"):
        time.sleep(3600)
    return 1.0


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
    if what == "bare":  # a bare except catches everything, the alarm's exception too
        try:
            time.sleep(3600)
        except:  # noqa: E722
            return 1.0
    if what == "cancel":  # a BaseException that is neither SystemExit nor KeyboardInterrupt
        import asyncio
        raise asyncio.CancelledError("checker cancelled")
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


RAISES = object()


@pytest.mark.parametrize(
    ("value", "score", "kind"),
    [
        (float("nan"), -1.0, "bad_values"),
        (float("inf"), -1.0, "bad_values"),
        (True, -1.0, "bad_values"),
        ("1.0", -1.0, "bad_values"),
        (RAISES, -1.0, "errors"),
        (1, 1.0, None),  # an int is a number: taken as 1.0
    ],
)
def test_a_trusted_scorer_is_checked_sample_by_sample_when_the_batch_check_fails(value, score, kind, monkeypatch):
    """Trusted scores are checked as a batch (floats, finite sum); a value that is not a finite
    float, or an exception, sends the batch through the per-sample check, which keeps the good
    scores, takes an int, and names a bad sample."""
    from rlpost.rewards.base import REWARDS, TRUSTED

    def shaky(s):
        if s.response != "odd":
            return 1.0 if s.response == s.ground_truth else 0.0
        if value is RAISES:
            raise ValueError("a bug in a trusted scorer")
        return value

    monkeypatch.setattr(REWARDS, "_values", dict(REWARDS._values))  # registrations undone afterwards
    REWARDS.register("shaky", shaky, trusted=True)
    p = pool("shaky")
    try:
        assert p.score([sample("7"), sample("8")]).scores == [1.0, 0.0]
        out = p.score([sample("7"), sample("odd"), sample("8")])
        assert out.scores == [1.0, score, 0.0]
        if kind is None:
            assert out.counts["errors"] == 0 and out.first_error is None
        else:
            assert out.counts["errors"] == 1 and out.counts[kind] == 1 and out.error_rows == [1]
            assert out.first_error.startswith("sample 1: ")
        assert p.pool.procs == [None, None]  # all in this process
    finally:
        p.close()
        TRUSTED.discard("shaky")


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


def test_one_alarm_per_chunk_ends_exactly_the_items_that_run_too_long():
    """The worker arms one alarm per chunk. When it rings it ends the item under way only if that
    item has run for the whole timeout, else it is set again for that item's own deadline: items
    that each stay under the timeout all count, however long the chunk takes, and each slow item
    among them (two in a row too) ends as a timeout, in about its timeout; after three in a row the
    rest of the chunk is not run."""
    import signal

    from rlpost.rewards.executor import _alarm, _run_chunk

    def item(seconds):
        time.sleep(seconds)
        return seconds

    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        quick = [0.03] * 6  # 0.18 s in all: the alarm rings twice or more while they run
        assert _run_chunk(item, quick, 0.05, "reward.timeout_s") == [(0.03, "ok", "")] * 6
        start = time.monotonic()
        results = _run_chunk(item, [0.001, 0.03, 5.0, 5.0, 0.001], 0.05, "reward.timeout_s")
        took = time.monotonic() - start
        assert [kind for _, kind, _ in results] == ["ok", "ok", "timeouts", "timeouts", "ok"]
        assert "reward.timeout_s=0.05" in results[2][2]
        assert 0.13 < took < 0.6, took  # each slow item had its 0.05 s, not much more
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # the chunk left no alarm behind
        # three in a row: the function hangs; the items after them count as timeouts, not run
        start = time.monotonic()
        results = _run_chunk(item, [0.001, 5.0, 5.0, 5.0, 0.001, 5.0], 0.05, "reward.timeout_s")
        assert [kind for _, kind, _ in results] == ["ok"] + ["timeouts"] * 5
        assert results[4][2] == "not run: the 3 items before it in this worker timed out (reward.timeout_s=0.05)"
        assert time.monotonic() - start < 0.5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_stop_signal_gives_up_a_batch_under_way_and_the_workers_are_replaced(user_file):
    """The seventh catalogue's s60: a SIGTERM while a slow reward scored a step waited for the whole
    step (about 21 minutes there). `interrupted()` turning true gives the batch up within a second
    or two; the pool's workers are fresh, and score the next batch."""
    from rlpost.rewards.executor import Interrupted

    p = pool(f"{user_file}:misbehave", timeout_s=60.0)
    try:
        asked = time.monotonic() + 1.5
        start = time.monotonic()
        with pytest.raises(Interrupted, match="2 of 2 workers stopped"):
            p.score([sample("sleep") for _ in range(4)], interrupted=lambda: time.monotonic() > asked)
        assert time.monotonic() - start < 6.0  # not 4 x 60 s / 2 workers
        out = p.score([sample("7"), sample("raise")], interrupted=lambda: False)
        assert out.scores == [1.0, -1.0] and out.counts["errors"] == 1
    finally:
        p.close()


def test_a_stopped_worker_is_replaced_after_one_timeout_without_progress_and_said(user_file, capsys):
    """The eleventh catalogue's t31: a SIGSTOPped reward worker held its share for 50 s (16 items x
    3 s), then its items were scored again, and nothing was said. The eighteenth's t45: it was still
    held for its whole share's timeouts (256 x 3 s); now for one item's timeout without progress."""
    import os
    import signal
    import time

    p = pool(f"{user_file}:length", workers=1, timeout_s=0.5)
    try:
        p.load()
        os.kill(p.pool.procs[0].pid, signal.SIGSTOP)
        began = time.monotonic()
        out = p.score([sample("x" * (i % 4)) for i in range(40)])  # a share of 40: 22 s before
        took = time.monotonic() - began
        assert out.scores == [float(i % 4) for i in range(40)] and out.counts["errors"] == 0  # again, fresh worker
    finally:
        p.close()
    assert took < 12
    assert (
        "reward: a worker finished no item in 2.5 s (reward.timeout_s=0.5 each; 0 of its 40 done), where its own "
        "alarm could not stop it (a stopped process, one stuck in native code, or reward.fn cancelled the alarm): "
        "replaced, and its items scored again one at a time\n"
    ) in capsys.readouterr().out


def test_a_function_stuck_where_no_alarm_reaches_costs_a_few_timeouts_not_one_per_item(tmp_path):
    """The eighteenth catalogue's t45, scored again one at a time: each item on a fresh worker got its
    timeout and grace (10 items: 7 s for the share, then 25 s); after 3 such timeouts the rest are
    counted as timeouts without running."""
    import time

    path = tmp_path / "stuck.py"
    path.write_text(
        "import signal, time\n\ndef score(sample):\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as native code that holds the GIL\n"
        "    time.sleep(60)\n    return 1.0\n"
    )
    p = pool(f"{path}:score", workers=1, timeout_s=0.5)
    try:
        p.load()
        began = time.monotonic()
        out = p.score([sample("x")] * 10)
        took = time.monotonic() - began
    finally:
        p.close()
    assert out.counts["timeouts"] == 10 and out.scores == [-1.0] * 10
    assert took < 16  # 2.5 s without progress, then 3 items of 2.5 s
    assert out.first_error.startswith("sample 0: timed out after reward.timeout_s=0.5 (killed)")


def test_a_bare_except_still_times_out_and_any_base_exception_is_an_error(user_file):
    """The fifteenth catalogue's t15: a function whose bare `except:` caught the alarm's exception and
    returned had its cut samples scored as ordinary results (reward/timeouts 0); t14: an
    asyncio.CancelledError killed the worker each time ("crashes", a traceback on stderr a sample)."""
    p = pool(f"{user_file}:misbehave", workers=1, timeout_s=0.5)
    try:
        out = p.score([sample("bare"), sample("ok"), sample("cancel"), sample("ok")])
        assert out.scores == [-1.0, 1.0, -1.0, 1.0]
        assert out.counts == {"errors": 2, "timeouts": 1, "bad_values": 0, "crashes": 0}  # (errors: every failure)
        assert out.first_error.startswith("sample 0: timed out after reward.timeout_s=0.5 (reward.fn caught")
    finally:
        p.close()


def test_a_reward_slow_on_one_prompt_times_out_on_its_samples_only(user_file):
    """The fifteenth catalogue's t30: a group's samples side by side made three timeouts in a row on one
    slow prompt read as a function that hangs, and the worker's other samples, of quick prompts,
    counted as timeouts without running."""
    from rlpost.rewards.pool import interleaved

    prompts = ["quick 1", "slow", "quick 2", "quick 3"]
    samples = [RewardInput(p, "x", "x", "mine") for p in prompts for _ in range(4)]  # groups of 4, side by side
    assert interleaved(list(range(16)), samples)[:8] == [0, 4, 8, 12, 1, 5, 9, 13]
    p = pool(f"{user_file}:slow_prompt", workers=1, timeout_s=0.3)
    try:
        out = p.score(samples)
        assert out.scores == [1.0] * 4 + [-1.0] * 4 + [1.0] * 8
        assert out.counts["timeouts"] == 4 and sorted(out.error_rows) == [4, 5, 6, 7]
    finally:
        p.close()
