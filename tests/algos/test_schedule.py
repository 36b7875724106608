"""The learning-rate shapes against values worked out by hand: the cosine decay (`cosine`) and the
trainer's schedule built on it (`lr_factor`: linear warm-up, then constant or cosine to
`min_lr_ratio` at the last optimizer step)."""

import math
from types import SimpleNamespace

import pytest

from rlpost.algos.schedule import cosine
from rlpost.trainer.engine import lr_factor


@pytest.mark.parametrize(
    "step, total, min_ratio, want",
    [
        (0, 10, 0.1, 1.0),  # the start is 1 whatever the floor
        (5, 10, 0.0, 0.5),  # half way: cos(pi / 2) = 0
        (5, 10, 0.2, 0.6),  # half way between 1 and the floor
        (10, 10, 0.1, 0.1),  # the end is the floor
        (25, 10, 0.1, 0.1),  # past the end it stays there
        (1, 1, 0.0, 0.0),  # one step long: the end at step 1
        (0, 0, 0.3, 1.0),  # no steps: the start
        (1, 4, 0.0, 0.5 * (1 + math.cos(math.pi / 4))),
    ],
)
def test_cosine(step, total, min_ratio, want):
    assert cosine(step, total, min_ratio) == pytest.approx(want, abs=1e-12)


def optim(schedule="cosine", warmup=2, floor=0.1):
    return SimpleNamespace(warmup_steps=warmup, lr_schedule=schedule, min_lr_ratio=floor)


def test_warm_up_then_cosine_to_the_floor_at_the_last_step():
    factors = [lr_factor(optim(), 7, s) for s in range(7)]
    # warm-up (s + 1) / 2, then 4 decaying steps: progress 0, 1/4, 1/2, 3/4... to 1 at step 6
    decay = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    assert factors == pytest.approx([0.5, 1.0, *decay])
    assert factors[-1] == pytest.approx(0.1)


def test_constant_after_warm_up_and_no_warm_up():
    assert [lr_factor(optim("constant", 3), 10, s) for s in range(5)] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1])
    assert lr_factor(optim("cosine", 0, 0.0), 3, 0) == 1.0
    assert lr_factor(optim("cosine", 0, 0.0), 3, 2) == pytest.approx(0.0)
