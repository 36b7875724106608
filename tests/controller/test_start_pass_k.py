"""`trainer.start_pass_k`: the start model's pass@k from k samples of each validation row."""

import pytest
import torch

from rlpost.controller.rollouts import BusyClock, Rollouts
from rlpost.rollout.base import SamplingParams


def scored(values, failed=()):
    """What `Scorer.score(..., rule_only=True)` returns: the scores, the error counts, the failed samples."""
    mask = torch.zeros(len(values), dtype=torch.bool)
    mask[list(failed)] = True
    return torch.tensor(values, dtype=torch.float32), {"errors": len(failed)}, mask


def test_pass_at_k_reads_each_rows_samples_together():
    """Rows come back as sample j of row i at i * n + j: row 0 has 1 right of 4, row 1 none,
    row 2 all four (read as n rows of len(rows) samples, the same scores would give others)."""
    rollouts = object.__new__(Rollouts)  # only generate, score and the busy clock are used
    rollouts.busy = BusyClock()
    scores = torch.tensor([1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1], dtype=torch.float32)
    seen = {}

    def generate(rows, params):
        seen["n"] = params.n
        return "batch"

    rollouts.generate = generate
    rollouts.score = lambda rows, batch, n, rule_only: (scores, {}, torch.zeros(len(scores), dtype=torch.bool))
    out = rollouts.pass_at_k(["a", "b", "c"], SamplingParams(n=4, temperature=0.7, max_tokens=8))
    assert seen["n"] == 4
    assert out == {
        "start/pass@1": (0.25 + 0 + 1) / 3,
        "start/pass@2": ((1 - 3 / 6) + 0 + 1) / 3,
        "start/pass@4": (1 + 0 + 1) / 3,
    }


def test_pass_at_k_includes_k_itself():
    """The fourteenth catalogue's t18: k=3 gave pass@1 and pass@2 only (powers of two)."""
    rollouts = object.__new__(Rollouts)
    rollouts.busy = BusyClock()
    rollouts.generate = lambda rows, params: "batch"
    rollouts.score = lambda rows, batch, n, rule_only: scored([1.0, 0.0, 0.0])
    out = rollouts.pass_at_k(["a"], SamplingParams(n=3, temperature=0.7, max_tokens=8))
    assert out == {"start/pass@1": pytest.approx(1 / 3), "start/pass@2": pytest.approx(2 / 3), "start/pass@3": 1.0}


def test_a_validations_samples_are_asked_ahead_of_queued_ones():
    """Async rollouts: the validation's generation goes before the stream's samples waiting on the
    engines (`SamplingParams.ahead`); a validation step cost async runs 18-34 s against 10-15 s
    one-step-off (benchmarks/real_model/async_h200x4b.json)."""
    rollouts = object.__new__(Rollouts)
    rollouts.busy, rollouts.cfg, asked = BusyClock(), None, []
    rollouts.generate = lambda rows, params: asked.append(params) or {}
    rollouts.score = lambda rows, batch, n, rule_only: scored([1.0, 0.0])
    out = rollouts.validate(["a", "b"], SamplingParams(n=1, greedy=True, seed=3))
    assert asked == [SamplingParams(n=1, greedy=True, seed=3, ahead=True)] and out["val/accuracy"] == 0.5


def test_a_validation_gives_its_top_score_beside_the_accuracy_it_counts_from_a_score_of_1():
    """The fourteenth catalogue's t01: scores of 10 and 3 counted every sample right; the top score
    (`val/score_max`) lets the run say that accuracy does not mean right on that scale."""
    rollouts = object.__new__(Rollouts)
    rollouts.busy, rollouts.cfg = BusyClock(), None
    rollouts.generate = lambda rows, params: {}
    rollouts.score = lambda rows, batch, n, rule_only: scored([10.0, 3.0, 0.5])
    out = rollouts.validate(["a", "b", "c"], SamplingParams(n=1, greedy=True, seed=3))
    assert out["val/score_max"] == 10.0 and out["val/accuracy"] == pytest.approx(2 / 3)
    assert out["val/reward_mean"] == pytest.approx(13.5 / 3)


def test_a_sample_that_failed_to_score_is_not_counted_right_whatever_it_scores():
    """The nineteenth catalogue's t126: `reward.error_score=1.0` gave failed samples a right answer's
    score, and val/accuracy read 1.000 with 30 of 64 failed; pass@k counted them too."""
    rollouts = object.__new__(Rollouts)
    rollouts.busy, rollouts.cfg = BusyClock(), None
    rollouts.generate = lambda rows, params: {}
    rollouts.score = lambda rows, batch, n, rule_only: scored([1.0, 1.0, 1.0, 0.0], failed=[1, 2])
    out = rollouts.validate(["a", "b", "c", "d"], SamplingParams(n=1, greedy=True, seed=3))
    assert out["val/accuracy"] == 0.25 and out["val/reward_mean"] == 0.75 and out["val/reward_errors"] == 2
    out = rollouts.pass_at_k(["a", "b"], SamplingParams(n=2, temperature=0.7, max_tokens=8))
    assert out == {"start/pass@1": 0.25, "start/pass@2": 0.5}
