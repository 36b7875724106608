"""The controller's scorer without Ray: which text each sample's reward function reads, the training
reward (rule x weight + model x weight + the environment's), a reward model's non-finite scores,
the split of samples over reward-model workers, and the stop when the reward function keeps failing.
Every figure is worked out by hand."""

import math

import pytest
import torch

from rlpost.config import load_config
from rlpost.controller.scoring import RewardFailure, Scorer
from rlpost.data.batch import Batch
from rlpost.data.dataset import PromptRow
from rlpost.rewards.executor import Scores


class Tokenizer:
    def batch_decode(self, ids, skip_special_tokens):
        assert skip_special_tokens
        return [" ".join(map(str, row)) for row in ids]


class Pool:
    """Returns the scores and error counts it is given, batch after batch; keeps what it scored."""

    def __init__(self, *results, kind="bad_values"):
        self.results, self.seen, self.kind = list(results), [], kind

    def score(self, samples, interrupted=None):
        self.seen.append(samples)
        scores, errors = self.results.pop(0)
        counts = {"errors": errors, "timeouts": 0, "bad_values": 0, "crashes": 0}
        counts[self.kind] = errors
        first = "sample 0: Traceback (most recent call last):\n  ...\nValueError: bad" if errors else None
        return Scores(scores, counts, first, list(range(errors)))


class RewardModels:
    """k workers; each scores a response by its length in characters (nan for the text "4")."""

    def __init__(self, k):
        self.k, self.calls = k, []

    def __len__(self):
        return self.k

    def submit(self, rank, method, prompts, responses):
        self.calls.append((rank, method, list(prompts), list(responses)))
        return [math.nan if r == "4" else float(len(r)) for r in responses]

    def get(self, refs):
        return refs


ROWS = [PromptRow([1], "p0", "g0", "src0"), PromptRow([2], "p1", "g1", "src1")]


def batch_of(ids, mask, **extra):
    return Batch({"response_ids": torch.tensor(ids), "response_mask": torch.tensor(mask), **extra})


def config(*extra):
    return load_config(["+recipe=quickstart", *extra])


def test_each_sample_reads_its_own_response_and_its_prompts_row():
    """Masked tokens are left out, a multi-turn sample is read from its last turn, sample i is of row
    i // n; validation (`rule_only`) takes the rule score alone and counts no failing batch."""
    pool = Pool(([1.0, 0.0, 0.5, 0.25], 0), ([1.0, 2.0, 3.0, 4.0], 4))
    said = []
    scorer = Scorer(config("reward.rule_weight=0.5"), Tokenizer(), pool, log=said.append)
    ids = [[5, 6, 7], [8, 9, 0], [10, 11, 12], [13, 14, 15]]
    mask = [[True, True, True], [True, True, False], [True, False, True], [False, True, True]]
    batch = batch_of(ids, mask, last_turn_start=torch.tensor([1, 0, 0, 1]))
    reward, errors, responses = scorer.score(ROWS, batch, n=2)
    assert responses == ["6 7", "8 9", "10 12", "15"]
    assert [(s.prompt, s.response, s.ground_truth, s.data_source) for s in pool.seen[0]] == [
        ("p0", "6 7", "g0", "src0"),
        ("p0", "8 9", "g0", "src0"),
        ("p1", "10 12", "g1", "src1"),
        ("p1", "15", "g1", "src1"),
    ]
    assert reward.tolist() == [0.5, 0.0, 0.25, 0.125] and errors["errors"] == 0
    rule, errors, _ = scorer.score(ROWS, batch, n=2, rule_only=True)
    assert rule.tolist() == [1.0, 2.0, 3.0, 4.0] and errors["errors"] == 4
    assert scorer.failing == 0 and "rule_scores" not in batch
    assert said == ["reward: 4 samples failed (4 bad_values); first: ValueError: bad"]  # (the first: quiet)


def test_samples_that_raised_are_said_without_an_empty_list_of_kinds():
    said = []
    scorer = Scorer(config(), Tokenizer(), Pool(([0.0, 0.0], 2), kind="errors"), log=said.append)
    scorer.score(ROWS[:1], batch_of([[1, 2], [3, 4]], [[True, True], [True, True]]), n=2)
    assert said == ["reward: 2 samples failed; first: ValueError: bad"]


def test_the_training_reward_weighs_rule_and_model_and_adds_the_environments():
    """0.5 x rule + 2 x model + env; the model's nan scores 0 and counts as a bad value."""
    pool = Pool(([1.0, 0.0, 1.0, 0.0], 1))
    models = RewardModels(k=2)
    said = []
    cfg = config("reward.rule_weight=0.5", "reward.model.path=tiny", "reward.model.weight=2")
    scorer = Scorer(cfg, Tokenizer(), pool, models, log=said.append)
    batch = batch_of([[1, 2], [3, 0], [4, 0], [5, 6]], [[True, True], [True, False], [True, False], [True, True]])
    batch["env_reward"] = torch.tensor([0.0, 1.0, 0.0, -1.0])
    reward, errors, _ = scorer.score(ROWS, batch, n=2)
    assert reward.tolist() == [0.5 + 6.0, 0.0 + 2.0 + 1.0, 0.5 + 0.0, 0.0 + 6.0 - 1.0]
    assert errors["errors"] == 2 and errors["bad_values"] == 2  # the rule's one and the model's nan
    assert said == [
        "reward: 1 samples failed (1 bad_values); first: ValueError: bad",  # its last line
        "reward model: 1 non-finite scores this step (first: sample 2)",
    ]
    assert batch["rule_scores"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert batch["model_scores"].tolist() == [3.0, 1.0, 0.0, 3.0]  # "1 2", "3", "4" (nan), "5 6"


@pytest.mark.parametrize(
    "k, parts", [(2, [[0, 1], [2, 3, 4]]), (3, [[0], [1, 2], [3, 4]]), (7, [[0], [1], [2], [3], [4]])]
)
def test_samples_are_split_over_the_reward_model_workers_in_order(k, parts):
    models = RewardModels(k)
    scorer = Scorer(config(), Tokenizer(), Pool(), models)
    samples = [type("S", (), {"prompt": f"p{i}", "response": "x" * (i + 1)}) for i in range(5)]
    assert scorer.model_scores(samples).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [call[2] for call in models.calls] == [[f"p{i}" for i in part] for part in parts]
    assert all(call[1] == "score" for call in models.calls) and len({c[0] for c in models.calls}) == len(parts)


def test_the_run_stops_when_too_many_samples_fail_for_max_error_steps_batches_in_a_row():
    """More than half of 4 samples (3) failing twice in a row stops the run; exactly half (2) is
    not too many, and a good batch between two bad ones starts the count again."""
    bad, half, good = ([0.0] * 4, 3), ([0.0] * 4, 2), ([1.0] * 4, 0)
    pool = Pool(bad, half, bad, good, bad, bad)
    scorer = Scorer(config("reward.max_error_fraction=0.5", "reward.max_error_steps=2"), Tokenizer(), pool)
    batch = batch_of([[1], [2], [3], [4]], [[True]] * 4)
    for failing in (1, 0, 1, 0, 1):
        scorer.score(ROWS, batch, n=2)
        assert scorer.failing == failing
    with pytest.raises(
        RewardFailure, match=r"^3 of 4 samples failed to score, more than reward.max_error_fraction=0.5 "
    ):
        scorer.score(ROWS, batch, n=2)


def test_the_pool_gets_the_stop_check_and_integer_scores_become_float32():
    """The mutation run's survivors (mutation_catalogue12.json): the check that gives the scoring up
    on a signal must reach the pool, and a reward function's integer scores train as float32."""

    class Checked(Pool):
        def score(self, samples, interrupted=None):
            self.seen.append(interrupted)
            return Scores([1, 0], {"errors": 0}, None, [])

    pool, stop = Checked(), (lambda: False)
    batch = batch_of([[1], [2]], [[True]] * 2)
    reward, _, _ = Scorer(config(), Tokenizer(), pool).score(ROWS[:1], batch, n=2, interrupted=stop)
    assert pool.seen == [stop] and reward.dtype == torch.float32
    rule, _, _ = Scorer(config(), Tokenizer(), pool).score(ROWS[:1], batch, n=2, rule_only=True)  # validation's
    assert rule.dtype == torch.float32 and rule.tolist() == [1.0, 0.0]


def test_a_worker_started_during_the_run_that_lacks_memory_names_reward_memory_mb():
    from rlpost.controller.scoring import not_loaded
    from rlpost.rewards.executor import WorkerStartError

    failure = "Traceback (most recent call last):\n  ...\nMemoryError: cannot import numpy"

    class Starting(Pool):
        def score(self, samples, interrupted=None):
            raise WorkerStartError(failure)

    with pytest.raises(Exception) as info:
        Scorer(config("reward.memory_mb=64"), Tokenizer(), Starting()).score(ROWS[:1], batch_of([[1]], [[True]]), n=1)
    assert str(info.value) == str(not_loaded(config().reward.fn, WorkerStartError(failure), 64, started=True))
    assert "MemoryError: cannot import numpy (under reward.memory_mb=64, each reward worker's memory cap" in str(
        info.value
    )
    said = str(not_loaded("f.py:score", RuntimeError("x\nOSError: one\nsecond line\n"), 0))
    assert said == "reward.fn='f.py:score' could not be loaded: OSError: one second line"  # from the named line on
    assert str(not_loaded("f.py:score", RuntimeError("no named line\nnor here\nlast"))).endswith("loaded: last")
    assert "memory_mb" not in str(not_loaded("f.py:score", RuntimeError("MemoryError: x")))  # no cap: no hint
    long = str(not_loaded("f.py:score", RuntimeError("OSError: " + "x" * 2000)))
    assert long.endswith("loaded: OSError: " + "x" * (1000 - len("OSError: ")))  # the first 1000 characters
