import re

import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from rlpost.data.batch import Batch
from rlpost.data.microbatch import padding_fraction, plan_shards, plan_step, shard_batch, split_shard
from tests.helpers import examples


def assert_warranted(e: ValueError, n: int, world: int) -> None:
    """A refusal names a rank with fewer rows than the micro-batches another rank needs: only then can
    no split even the counts out (a rank balanced by tokens may hold fewer than n // world rows)."""
    found = re.fullmatch(r"cannot give every rank (\d+) micro-batches: a rank has only (\d+) rows; .*", str(e))
    assert found, str(e)
    target, rows = int(found[1]), int(found[2])
    assert 1 <= rows < target <= -(-n // world), (n, world, str(e))


def test_ranks_are_evened_out_under_a_token_budget():
    """Two ranks, a 100-token padded budget: rank 0 (rows 0, 3, 4: 100, 10, 10 tokens) cuts into 2
    micro-batches, rank 1 (90, 60, 10) into 3, so rank 0's [3, 4] is split to give both 3."""
    widths = [(1, 99), (1, 89), (1, 59), (1, 9), (1, 9), (1, 9)]
    lengths = [100, 90, 60, 10, 10, 10]
    assert plan_shards(lengths, 2, max_tokens=100, widths=widths) == [[[0], [3], [4]], [[1], [2], [5]]]


@settings(max_examples=examples(200), deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=2, max_size=64),
    world=st.integers(1, 4),
    budget=st.sampled_from([0, 64, 256, 1000]),
    rows=st.sampled_from([0, 1, 3, 8]),
)
def test_plan_covers_every_row_once_with_equal_micro_batch_counts(lengths, world, budget, rows):
    assume(len(lengths) >= world)
    try:
        plan = plan_shards(lengths, world, budget, rows)
    except ValueError as e:  # only when a rank has fewer rows than the others have micro-batches
        assert_warranted(e, len(lengths), world)
        assert budget or rows  # one micro-batch a rank always fits
        if not budget:  # rows alone: ranks of n // world or one more rows, ceil(rows of a rank / rows) each
            most = -(-(-(-len(lengths) // world)) // rows)
            assert len(lengths) // world < most, (len(lengths), world, rows)
        event("refused")
        return
    seen = sorted(i for rank in plan for mb in rank for i in mb)
    assert seen == list(range(len(lengths)))
    assert len({len(rank) for rank in plan}) == 1  # FSDP: same number of micro-batches everywhere
    for rank in plan:
        for mb in rank:
            assert mb, "no empty micro-batch"
            if budget and len(mb) > 1 and not rows:
                # over budget only when evening-out merged nothing: splitting only shrinks
                assert sum(lengths[i] for i in mb) <= budget


@settings(max_examples=examples(200), deadline=None)
@given(
    widths=st.lists(st.tuples(st.integers(1, 100), st.integers(0, 300)), min_size=2, max_size=64),
    world=st.integers(1, 4),
    budget=st.sampled_from([64, 256, 1000]),
)
def test_a_padded_layouts_budget_counts_its_padding(widths, world, budget):
    """With `widths`, a micro-batch of several rows computes at most `budget` tokens padded:
    rows x (longest prompt + longest response), what a padded forward's logits hold."""
    lengths = [p + r for p, r in widths]
    assume(len(lengths) >= world)
    try:
        plan = plan_shards(lengths, world, budget, 0, widths)
    except ValueError as e:  # a rank with fewer rows than the micro-batches the budget asks of another
        assert_warranted(e, len(lengths), world)
        event("refused")
        return
    assert sorted(i for rank in plan for mb in rank for i in mb) == list(range(len(lengths)))
    for rank in plan:
        for mb in rank:
            if len(mb) > 1:
                assert len(mb) * (max(widths[i][0] for i in mb) + max(widths[i][1] for i in mb)) <= budget


def test_a_padded_micro_batch_is_cut_by_its_padded_size():
    """A short row beside a long one costs the long one's width: 4 rows of real lengths 10, 10,
    10 and 100 fit a 200-token budget in one micro-batch, but padded they are 4 x 100."""
    widths = [(5, 5), (5, 5), (5, 5), (5, 95)]
    lengths = [10, 10, 10, 100]
    assert plan_shards(lengths, 1, max_tokens=200) == [[[0, 1, 2, 3]]]
    assert plan_shards(lengths, 1, max_tokens=200, widths=widths) == [[[0, 1, 2], [3]]]
    assert plan_step(lengths, 1, 1, 200, 0, widths) == [[[[0, 1, 2], [3]]]]


def test_ranks_are_balanced_by_tokens_not_rows():
    lengths = [100, 60, 50, 10, 10, 10, 10, 10]
    plan = plan_shards(lengths, 2)
    tokens = [sum(lengths[i] for mb in rank for i in mb) for rank in plan]
    rows = [sum(len(mb) for mb in rank) for rank in plan]
    assert tokens == [130, 130] and rows == [4, 4]  # contiguous halves would be [230, 30]


def test_token_budget_cuts_micro_batches():
    plan = plan_shards([30, 30, 30, 30, 30, 30], 1, max_tokens=64)
    assert [len(mb) for mb in plan[0]] == [2, 2, 2]
    assert padding_fraction([10, 30], [[[0, 1]]]) == pytest.approx(1 - 40 / 60)


def test_shard_and_split_round_trip():
    n = 8
    batch = Batch({"x": torch.arange(n) * 10, "len": torch.tensor([5, 1, 1, 1, 5, 1, 1, 1])})
    plan = plan_step(batch["len"].tolist(), world_size=2, num_mini_batches=2, max_rows=2)
    shards = shard_batch(batch, plan)
    rows = torch.cat([s["row_index"] for s in shards])
    assert sorted(rows.tolist()) == list(range(n))
    for shard in shards:
        minis = split_shard(shard)
        assert len(minis) == 2
        for m, mini in enumerate(minis):
            for mb in mini:
                # mini-batch m holds rows of the m-th contiguous half of the batch
                assert all(m * 4 <= r < (m + 1) * 4 for r in mb["row_index"].tolist())
                assert torch.equal(mb["x"], mb["row_index"] * 10)
    with pytest.raises(ValueError, match="equal mini-batches"):
        plan_step([1] * 7, 2, 2)
