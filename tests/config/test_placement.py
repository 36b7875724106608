"""The one answer to "colocated?", "taking turns on GPUs?", "overlapping?" and "engines pinned to
the trainers' GPUs?" (`rlpost.config.Colocation`), from the settings that decide each."""

import pytest

from rlpost.config import Colocation, compose


@pytest.mark.parametrize(
    "overrides, colocated, takes_turns, overlapping, pinned",
    [
        ([], True, False, False, False),  # the quickstart: colocated on the CPU
        (["trainer.device=cuda"], True, True, False, False),
        (["trainer.device=cuda", "rollout.tensor_parallel_size=2"], True, True, False, True),
        (
            ["cluster.placement=split", "trainer.device=cuda", "rollout.tensor_parallel_size=2"],
            False,
            False,
            True,  # split: one step off by default
            False,
        ),
        (["cluster.placement=split", "algo.max_staleness=0"], False, False, False, False),
        (["cluster.placement=split", "algo.max_staleness=1"], False, False, True, False),
        (["algo.max_staleness=1"], True, False, False, False),  # colocated: nothing runs beside the update
    ],
)
def test_each_answer_follows_its_settings(overrides, colocated, takes_turns, overlapping, pinned):
    c = Colocation.of(compose(["+recipe=quickstart", *overrides]))
    assert (c.colocated, c.takes_turns, c.overlapping, c.pins_engine_gpus) == (
        colocated,
        takes_turns,
        overlapping,
        pinned,
    )
