"""A process group of its own between trainer rank 0 (rank 0 here) and the rollout actors.

The trainer ranks already belong to their FSDP default group, and rollout actors are not part of
it, so the sync group is built directly from a TCP store: gloo on CPU, NCCL on CUDA. Only the
few collectives a weight sync needs are exposed.
"""

from __future__ import annotations

import datetime
import pickle
import socket

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class SyncGroup:
    def __init__(self, host: str, port: int, rank: int, world_size: int, device: str, timeout_s: int):
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout)
        if self.device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            self.pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        self.barrier()  # every member is connected before the first sync

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        self.pg.broadcast([tensor], self._opts(dist.BroadcastOptions, rootRank=src)).wait()
        return tensor

    def all_reduce_max(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        opts = self._opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.MAX)
        self.pg.allreduce([t], opts).wait()
        return int(t.item())

    def broadcast_object(self, obj=None, src: int = 0):
        """Pickle `obj` on `src`, return the unpickled copy on every rank."""
        if self.rank == src:
            data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(self.device)
            size = torch.tensor([data.numel()], dtype=torch.int64, device=self.device)
        else:
            size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.broadcast(size, src)
        if self.rank != src:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self.broadcast(data, src)
        return obj if self.rank == src else pickle.loads(data.cpu().numpy().tobytes())

    def barrier(self) -> None:
        self.all_reduce_max(0)

    @staticmethod
    def _opts(cls, **values):
        opts = cls()
        for k, v in values.items():
            setattr(opts, k, v)
        return opts
