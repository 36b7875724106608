"""The chat tasks' rewards (`last_number`, `answer_line`: trusted, in the controller) and the
task libraries' (`reasoning_gym`, `math_verify`: in the reward pool's processes)."""

import json
import signal
import sys
import time

import pytest

from rlpost.rewards import REWARDS, RewardInput
from rlpost.rewards.base import TRUSTED
from rlpost.rewards.builtin import extract_answer_line
from rlpost.rewards.library import gold_text, gym_answer, require
from rlpost.rewards.pool import RewardPool

pytestmark = pytest.mark.timeout(180)


def sample(response, truth, source):
    return RewardInput("prompt", response, truth, source)


# ------------------------------------------------------------------------------- last_number
@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("23 + 45 = 68", "68", 1.0),
        ("68.", "68", 1.0),
        ("86", "68", 0.0),
        ("no number here", "68", 0.0),
        ("", "68", 0.0),
        ("068", "68", 1.0),  # the same number: leading zeros, a decimal point or zeros after it
        ("68.0", "68", 1.0),
        ("68.5", "68", 0.0),
        ("It is 1,068.", "1068", 1.0),
        ("68, not 86", "68", 0.0),  # the last number counts
        ("-68", "-68", 1.0),
        ("-68", "68", 0.0),
        ("9" * 5000 + "8", "9" * 5000 + "8", 1.0),  # integers compare exactly, however long
        ("9" * 5000 + "7", "9" * 5000 + "8", 0.0),
    ],
)
def test_last_number(response, truth, score):
    assert REWARDS["last_number"](sample(response, truth, "last_number")) == score


def test_a_ground_truth_that_is_no_number_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="ground truth 'sixty' is not a number"):
        REWARDS["last_number"](sample("60", "sixty", "last_number"))


# ------------------------------------------------------------------------------- answer_line
@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("23 + 45 = 68\n68 + 12 = 80\nAnswer: 80", "80", 1.0),
        ("answer: 80.", "80", 1.0),  # any case, a trailing period
        ("**Answer:** $1,080", "1080", 1.0),
        ("Answer: 70\nno wait\nAnswer: 80", "80", 1.0),  # the last Answer: counts
        ("Answer: 80\nAnswer: 70", "80", 0.0),
        ("Answer: 80 (70 + 10)", "80", 1.0),  # the first number after it
        ("Answer: 70, i.e. 80", "80", 0.0),
        ("the total is 80", "80", 0.0),  # no Answer: line
        ("Answer:\n80", "80", 0.0),  # nothing after it on its line
        ("Answer: eighty", "80", 0.0),
        ("Answer: 080", "80", 1.0),
    ],
)
def test_answer_line(response, truth, score):
    assert REWARDS["answer_line"](sample(response, truth, "answer_line")) == score


SUM_PROMPT = "<|im_start|>user\nWhat is 5 + 7 + 2 + 9? Work it out step by step.<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "response, score",
    [
        ("5 + 7 = 12\n12 + 2 = 14\n14 + 9 = 23\nAnswer: 23", 1.0),
        ("5+7=12, 12+2=14, so 23.", 1.0),  # the last running total is the answer itself
        ("The answer is 23", 0.0),  # right, but no steps: the steps must pay
        ("5 + 7 = 12, 12 + 2 = 15, 15 + 9 = 23", 0.0),  # a wrong step
        ("14, 12, 23", 0.0),  # the running totals out of order
        ("12, 14, 23, 24", 0.0),  # the last number is not the sum
        ("", 0.0),
    ],
)
def test_running_total_pays_the_steps(response, score):
    assert REWARDS["running_total"](RewardInput(SUM_PROMPT, response, "23", "running_total")) == score
    wrong_truth = RewardInput(SUM_PROMPT, "5 + 7 = 12\n12 + 2 = 14\n14 + 9 = 23", "24", "running_total")
    assert REWARDS["running_total"](wrong_truth) == 0.0  # the ground truth is checked too
    with pytest.raises(ValueError, match="no sum"):
        REWARDS["running_total"](RewardInput("What is it?", response, "23", "running_total"))


def test_the_chat_rewards_take_linear_time():
    start = time.perf_counter()
    assert extract_answer_line("Answer: " * 100_000 + "5") == "5"
    assert extract_answer_line("Answer: " + "." * 200_000 + " 5") == "5"
    assert REWARDS["last_number"](sample("." * 200_000 + " 5", "5", "last_number")) == 1.0
    assert time.perf_counter() - start < 2.0  # quadratic would be minutes


# ----------------------------------------------------------------------------- reasoning_gym
@pytest.fixture(scope="module")
def gym_entry():
    rg = pytest.importorskip("reasoning_gym")
    entry = rg.create_dataset("basic_arithmetic", size=1, seed=5)[0]
    truth = json.dumps({"dataset": "basic_arithmetic", "answer": entry["answer"], "metadata": entry["metadata"]})
    return entry["answer"], truth


def test_gym_answer_is_the_last_tag_or_the_last_line():
    pytest.importorskip("reasoning_gym")
    assert gym_answer("think <answer>1</answer> then <answer> 2 </answer>") == "2"
    assert gym_answer("the sum is\n  42 \n\n") == "42"
    assert gym_answer("") == "" and gym_answer("\n \n") == ""


@pytest.mark.parametrize(
    "template, score",
    [
        ("I add them up.\n<answer>{answer}</answer>", 1.0),
        ("<answer>{wrong}</answer>", 0.0),
        ("<answer>{wrong}</answer> or rather <answer>{answer}</answer>", 1.0),
        ("I add them up:\n{answer}\n", 1.0),  # no tags: the last non-empty line
        ("{answer}\nso that is it", 0.0),
        ("", 0.0),
    ],
)
def test_reasoning_gym_scores_with_the_datasets_scorer(gym_entry, template, score):
    answer, truth = gym_entry
    response = template.format(answer=answer, wrong=int(answer) + 1)
    assert REWARDS["reasoning_gym"](sample(response, truth, "reasoning_gym")) == score


# ------------------------------------------------------------------------------- math_verify
@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("\\frac{1}{2}", "0.5", 1.0),
        ("The answer is $x=3$", "3", 1.0),
        ("The answer is $\\boxed{0.5}$", "\\frac{1}{2}", 1.0),
        ("The answer is $x^2 + 1$", "x^2+1", 1.0),  # the gold parses only as LaTeX: wrapped in $...$
        ("The answer is $4$", "3", 0.0),
        ("I do not know", "3", 0.0),
        ("", "3", 0.0),
    ],
)
def test_math_verify(response, truth, score):
    pytest.importorskip("math_verify")
    assert REWARDS["math_verify"](sample(response, truth, "math_verify")) == score


def test_gold_text_wraps_what_is_not_latex_yet():
    assert gold_text(" 0.5 ") == "$0.5$" and gold_text("\\frac{1}{2}") == "\\frac{1}{2}" and gold_text("$3$") == "$3$"


def test_math_verify_leaves_the_callers_alarm_alone():
    """math-verify's own timeouts would set SIGALRM's handler and then cancel the timer: the reward
    pool's alarm for the rest of the chunk. Ours are off, so the timer runs on untouched."""
    pytest.importorskip("math_verify")
    rang = []
    handler = lambda *a: rang.append(1)  # noqa: E731
    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        assert REWARDS["math_verify"](sample("$\\frac{2}{4}$", "0.5", "math_verify")) == 1.0
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert signal.getsignal(signal.SIGALRM) is handler and 90 < left <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not rang


def test_a_missing_library_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(ImportError, match=r"math-verify package: pip install 'math-verify>=0\.9'"):
        require("math_verify")


# ------------------------------------------------------------------------ routing, the pool
def test_auto_routes_each_task_source_and_only_the_libraries_leave_this_process():
    assert {"last_number", "answer_line"} <= TRUSTED and not {"reasoning_gym", "math_verify"} & TRUSTED
    pool = RewardPool("auto", {}, 1, 30.0, 4096, -1.0)
    assert [pool.trusted(sample("1", "1", s)) for s in ("last_number", "answer_line")] == [True, True]
    assert [pool.trusted(sample("1", "1", s)) for s in ("reasoning_gym", "math_verify")] == [False, False]
    out = pool.score([sample("so 68", "68", "last_number"), sample("Answer: 7", "7", "answer_line")])
    assert out.scores == [1.0, 1.0] and pool.pool.procs == [None]  # no process was needed
    pool.close()


def test_the_library_rewards_score_in_worker_processes_by_data_source(gym_entry):
    pytest.importorskip("math_verify")
    answer, truth = gym_entry
    samples = [
        sample(f"<answer>{answer}</answer>", truth, "reasoning_gym"),
        sample(f"<answer>{int(answer) + 1}</answer>", truth, "reasoning_gym"),
        sample("$\\frac{1}{2}$", "0.5", "math_verify"),
        sample("$\\frac{1}{3}$", "0.5", "math_verify"),
        sample("the sum is 68", "68", "last_number"),
        sample("Answer: 68", "86", "answer_line"),
    ]
    pool = RewardPool("auto", {}, 2, 60.0, 4096, -1.0)  # reward.memory_mb's default cap
    try:
        out = pool.score(samples)
        assert out.scores == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0], out.first_error
        assert out.counts["errors"] == 0 and all(p is not None and p.is_alive() for p in pool.pool.procs)
    finally:
        pool.close()


HANGS = """
import time
from rlpost.rewards import REWARDS

def math_or_hang(sample):
    if sample.data_source == "hang":
        while True:
            time.sleep(0.01)
    return REWARDS["math_verify"](sample)
"""


def test_the_pools_alarm_still_ends_a_later_sample_of_the_chunk(tmp_path):
    """After a math_verify sample, a sample that hangs is ended by the worker's own alarm: the
    worker lives on (with math-verify's own timeouts the alarm is gone, and the parent has to kill
    and replace the worker once the chunk's deadline passes)."""
    pytest.importorskip("math_verify")
    (tmp_path / "hang.py").write_text(HANGS)
    pool = RewardPool(f"{tmp_path / 'hang.py'}:math_or_hang", {}, 1, 1.0, 4096, -1.0)
    try:
        assert pool.score([sample("$1$", "1", "math_verify")]).scores == [1.0]  # the worker is up
        pid = pool.pool.procs[0].pid
        samples = [sample("$\\frac{1}{2}$", "0.5", "math_verify"), sample("", "", "hang")]
        out = pool.score(samples + [sample("$3$", "3", "math_verify")])
        assert out.scores == [1.0, -1.0, 1.0] and out.counts["timeouts"] == 1
        assert "(killed)" not in out.first_error and pool.pool.procs[0].pid == pid
    finally:
        pool.close()
