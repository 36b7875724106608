"""Which rows each data-parallel rank gets, and how each rank cuts them into micro-batches.

`plan_shards` balances ranks by tokens, not rows: rows go longest-first to the rank with the
fewest tokens so far (greedy LPT), so no rank waits long for the slowest one; no rank takes more
than its share ceil(rows / world_size) of rows, so that all can run as many micro-batches. Each
rank's rows are then cut into micro-batches of at most `max_tokens` tokens (a longer row goes
alone), or of `max_rows` rows when no token budget is set. Tokens are counted as the layout
computes them: each row's own in the packed layout; with `widths` (each row's prompt and response
lengths), a padded micro-batch's rows x (longest prompt + longest response), padding included:
its logits are that size, and for a 50k vocabulary they are most of a micro-batch's memory. FSDP
runs collectives in every micro-batch, so all ranks must run the same number of them: ranks with
fewer are evened out by splitting their largest micro-batches.

A plan is a list, per rank, of micro-batches, each a list of row indices into the full batch.
"""

from __future__ import annotations


def plan_shards(
    lengths: list[int], world_size: int, max_tokens: int = 0, max_rows: int = 0, widths: list | None = None
) -> list[list[list[int]]]:
    if len(lengths) < world_size:
        raise ValueError(f"{len(lengths)} rows cannot feed {world_size} data-parallel ranks")
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    count = [0] * world_size
    cap = -(-len(lengths) // world_size)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        # fewest tokens first among ranks with room; ties go to the rank with fewer rows
        r = min((r for r in range(world_size) if count[r] < cap), key=lambda r: (load[r], count[r]))
        ranks[r].append(i)
        load[r] += lengths[i]
        count[r] += 1
    plans = [_cut(sorted(rows), lengths, max_tokens, max_rows, widths) for rows in ranks]
    target = max(len(p) for p in plans)
    for plan in plans:
        while len(plan) < target:
            big = max(range(len(plan)), key=lambda k: (len(plan[k]) > 1, sum(lengths[i] for i in plan[k])))
            if len(plan[big]) < 2:
                raise ValueError(
                    f"cannot give every rank {target} micro-batches: a rank has only "
                    f"{sum(len(m) for m in plan)} rows; lower the token budget or the world size"
                )
            rows = plan.pop(big)
            half = len(rows) // 2
            plan[big:big] = [rows[:half], rows[half:]]
    return plans


def _cut(rows: list[int], lengths: list[int], max_tokens: int, max_rows: int, widths=None) -> list[list[int]]:
    if not max_tokens:
        size = max_rows or len(rows)
        return [rows[i : i + size] for i in range(0, len(rows), size)]
    micro: list[list[int]] = [[]]
    for i in rows:
        if micro[-1] and (
            _tokens(micro[-1] + [i], lengths, widths) > max_tokens or (max_rows and len(micro[-1]) >= max_rows)
        ):
            micro.append([])
        micro[-1].append(i)
    return micro


def _tokens(rows: list[int], lengths: list[int], widths) -> int:
    """The tokens a micro-batch of `rows` computes: their own, or padded (`widths`)."""
    if widths is None:
        return sum(lengths[i] for i in rows)
    return len(rows) * (max(widths[i][0] for i in rows) + max(widths[i][1] for i in rows))


def padding_fraction(lengths: list[int], plan: list[list[list[int]]]) -> float:
    """Share of a padded layout's tokens that are padding, for the micro-batches of `plan`
    (each padded to its longest row): the work packing avoids."""
    padded = sum(len(m) * max(lengths[i] for i in m) for rank in plan for m in rank if m)
    real = sum(lengths[i] for rank in plan for m in rank for i in m)
    return 1.0 - real / padded if padded else 0.0


def plan_step(
    lengths: list[int],
    world_size: int,
    num_mini_batches: int,
    max_tokens: int = 0,
    max_rows: int = 0,
    widths: list | None = None,
) -> list[list[list[list[int]]]]:
    """Plan a whole step: rows are cut into `num_mini_batches` contiguous mini-batches (one
    optimizer step each; prompt groups stay whole), each planned by `plan_shards` (`widths`:
    count padded tokens). Returns plan[rank][mini][micro] = row indices of the full batch."""
    if len(lengths) % num_mini_batches:
        raise ValueError(f"{len(lengths)} rows do not split into {num_mini_batches} equal mini-batches")
    size = len(lengths) // num_mini_batches
    plan: list[list[list[list[int]]]] = [[] for _ in range(world_size)]
    for m in range(num_mini_batches):
        offset = m * size
        part = widths[offset : offset + size] if widths is not None else None
        shards = plan_shards(lengths[offset : offset + size], world_size, max_tokens, max_rows, part)
        for rank, micro in enumerate(shards):
            plan[rank].append([[offset + i for i in mb] for mb in micro])
    return plan


def shard_batch(batch, plan) -> list:
    """One `Batch` per rank holding its rows in plan order, tagged with `row_index` (position in
    the full batch), `mini_batch_ids` and `micro_batch_ids` (index within the mini-batch)."""
    import torch

    shards = []
    for rank_plan in plan:
        rows, minis, micros = [], [], []
        for m, mini in enumerate(rank_plan):
            for k, micro in enumerate(mini):
                rows += micro
                minis += [m] * len(micro)
                micros += [k] * len(micro)
        shard = batch.select(rows)
        shard["row_index"] = torch.tensor(rows, dtype=torch.long)
        shard["mini_batch_ids"] = torch.tensor(minis, dtype=torch.long)
        shard["micro_batch_ids"] = torch.tensor(micros, dtype=torch.long)
        shards.append(shard)
    return shards


def split_shard(shard) -> list[list]:
    """A rank's shard -> its mini-batches, each a list of micro-batch `Batch`es, in plan order."""
    out = []
    minis, micros = shard["mini_batch_ids"], shard["micro_batch_ids"]
    for m in range(int(minis.max()) + 1 if len(shard) else 0):
        in_mini = minis == m
        out.append([shard.select(in_mini & (micros == k)) for k in range(int(micros[in_mini].max()) + 1)])
    return out


def padded_tokens(mb) -> int:
    """Tokens a padded layout computes for micro-batch `mb`: rows x (longest prompt + longest
    response), what the memory plan sizes a micro-batch by (`rlpost.controller.plan`)."""
    if not len(mb):
        return 0
    return len(mb) * int(mb["prompt_mask"].sum(-1).max() + mb["response_mask"].sum(-1).max())
