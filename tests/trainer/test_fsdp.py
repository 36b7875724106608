"""`shard_model`: FSDP2 where there is something to shard, cast or offload; a plain module on one
rank in float32 without offload (FSDP2's hooks and copies would be pure cost there). Both paths train to the
same gradients: tests/roles/test_update_reference.py checks world size 1 and 2 against one
from-scratch reference."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from rlpost.weightsync.transport import free_port
from tests.helpers import run_ranks, small_model


def wrapped(rank, world, port, dtype, cpu_offload, out):
    from torch.distributed.fsdp import FSDPModule

    from rlpost.trainer.fsdp import shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = shard_model(small_model(torch.float32), torch.device("cpu"), dtype, cpu_offload=cpu_offload)
        kinds = [isinstance(m, FSDPModule) for m in model.modules()]
        if rank == 0:
            torch.save({"root": kinds[0], "units": sum(kinds)}, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("world", "dtype", "cpu_offload", "sharded"),
    [
        (1, torch.float32, False, False),
        (1, torch.bfloat16, False, True),
        (1, torch.float32, True, True),  # FSDP2 keeps the parameters on the host (on a GPU)
        (2, torch.float32, False, True),
    ],
)
def test_fsdp2_wraps_where_it_shards_casts_or_offloads_and_one_float32_rank_stays_plain(
    tmp_path, world, dtype, cpu_offload, sharded
):
    out = tmp_path / "kinds.pt"
    run_ranks(wrapped, world, free_port(), dtype, cpu_offload, str(out))
    kinds = torch.load(out)
    assert kinds == ({"root": True, "units": 4} if sharded else {"root": False, "units": 0})  # 3 layers + root
