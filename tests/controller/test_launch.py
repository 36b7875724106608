"""`Rollouts.launch`: how a batch's prompts and seeds are split over the rollout actors."""

from types import SimpleNamespace

import pytest

from rlpost.controller.rollouts import Rollouts
from rlpost.rollout.base import SamplingParams


class Group:
    """The rollout worker group's `submit`, recorded."""

    def __init__(self, actors: int):
        self.actors, self.calls = actors, []

    def __len__(self):
        return self.actors

    def submit(self, rank, method, prompts, params):
        self.calls.append((rank, prompts, params.seed))
        return rank


@pytest.mark.parametrize("actors, prompts", [(1, 5), (2, 5), (3, 8), (4, 3)])
def test_every_sample_of_a_batch_has_a_seed_of_its_own_and_a_group_stays_on_one_actor(actors, prompts):
    """An engine seeds sample j of its p-th prompt with seed + p * n + j: across actors the seeds
    of a batch must not repeat (actor 1's first prompt took actor 0's sample-1 seed before)."""
    rollouts = object.__new__(Rollouts)
    rollouts.group = Group(actors)
    rollouts.cfg = SimpleNamespace(env=SimpleNamespace(name=""))
    rows = [SimpleNamespace(prompt_ids=[i]) for i in range(prompts)]
    n = 4
    rollouts.launch(rows, SamplingParams(n=n, max_tokens=8, seed=1000))
    seeds, order = [], []
    for _, part, seed in rollouts.group.calls:
        order += [p[0] for p in part]  # each prompt once, in order: its n samples on one actor
        seeds += [seed + p * n + j for p in range(len(part)) for j in range(n)]
    assert order == list(range(prompts))
    assert sorted(seeds) == list(range(1000, 1000 + prompts * n))  # the single-actor seeds, each once


@pytest.mark.parametrize("overlap", [False, True])
def test_a_batch_whose_scoring_a_signal_stopped_goes_back_to_be_saved(overlap):
    """The seventh catalogue's s60: scoring given up (`Interrupted`) puts the generated batch back
    in front of the pending ones, so the checkpoint holds it and a resumed run trains it as is."""
    from collections import deque

    from rlpost.controller.rollouts import Pending
    from rlpost.rewards.executor import Interrupted

    rollouts = object.__new__(Rollouts)
    rollouts.cfg = SimpleNamespace(rollout=SimpleNamespace(n=2), algo=SimpleNamespace(max_staleness=1),
                                   trainer=SimpleNamespace(total_steps=9))  # fmt: skip
    rollouts.stream, rollouts.overlap, rollouts.interrupted = None, overlap, lambda: True
    first = Pending(["a"], ["ref-a"])
    rollouts.pending = deque([first])
    rollouts.gather = lambda refs, prompts, n: {"from": refs}
    rollouts._queue = lambda step: rollouts.pending.append(Pending(["b"], ["ref-b"]))

    def score(rows, batch, n, interrupted=None):
        assert interrupted is rollouts.interrupted
        raise Interrupted("reward: 1 of 1 workers stopped at their share")

    rollouts.score = score
    with pytest.raises(Interrupted):
        rollouts.next_scored(step=3)
    assert list(rollouts.pending)[0] is first  # the batch it generated for step 4, first again
    assert [p.rows for p in rollouts.pending] == ([["a"], ["b"]] if overlap else [["a"]])
