"""A process group of its own between trainer rank 0 (rank 0 here) and the rollout actors.

The trainer ranks already belong to their FSDP default group, and rollout actors are not part of
it, so the sync group is built directly from a TCP store. Buckets of weights travel by
- `broadcast`: gloo on CPU, NCCL between GPUs (split placement);
- `ipc`: CUDA IPC between processes that share one GPU (colocate placement; NCCL refuses two
  ranks on one device). The sender shares each bucket's memory; receivers map it, copy it once
  and acknowledge, and only then does the sender reuse the memory. Control messages go over gloo.
Only the few collectives a weight sync needs are exposed.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import pickle
import random
import socket

import torch
import torch.distributed as dist

_LOWEST_PORT = 20000  # Ray's workers listen below this (its default worker port range ends at 19999)


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux's default if it cannot say)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port free to listen on now, between 20000 and the ephemeral range. A port of that range
    (what binding port 0 gives) can be taken by any process's next outgoing connection before the
    caller listens on it: a resumed run's sync group failed so, with EADDRINUSE, among Ray's many
    connections. Outside it only another listener can take it first."""
    start = ephemeral_ports()[0]
    pick = random.SystemRandom()  # not the seeded `random`: processes seeded alike must differ
    candidates = [pick.randrange(_LOWEST_PORT, start) for _ in range(100)] if start > _LOWEST_PORT + 1000 else []
    for port in candidates + [0]:  # 0: the kernel's choice, if none is free (or the range is unusual)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:  # taken, or just closed (TIME_WAIT)
                continue
            return s.getsockname()[1]
    raise OSError("no free port")


@contextlib.contextmanager
def stacks_if_stuck(seconds: float):
    """Print the Python stack of every thread of this process to stderr if the block still runs
    after `seconds` (faulthandler: it prints even while a thread holds the GIL). A sync stuck in a
    transfer then shows on each rank where it waits; gloo and NCCL only say that they timed out."""
    faulthandler.dump_traceback_later(seconds)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


_MESSAGE_BYTES = 1 << 16  # control messages up to this size take one broadcast


class SyncGroup:
    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        device: str,
        timeout_s: int,
        transport: str = "broadcast",
    ):
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.transport = rank, world_size, transport
        self.device = torch.device(device)
        if transport == "ipc" and self.device.type != "cuda":
            raise ValueError("the ipc transport shares CUDA memory; use broadcast on the CPU")
        store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout)
        nccl = self.device.type == "cuda" and transport == "broadcast"
        if nccl:
            opts = dist.ProcessGroupNCCL.Options()
            self.pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        # where control tensors live: the device for NCCL, else the host
        self.control = self.device if nccl else torch.device("cpu")
        self.barrier()  # every member is connected before the first sync
        if transport == "ipc":  # a receiver maps the sender's memory as its own device's: same GPU?
            mine = str(torch.cuda.get_device_properties(self.device).uuid)
            theirs = self.broadcast_object(mine if rank == 0 else None)
            if theirs != mine:
                raise ValueError(
                    f"weight sync over CUDA IPC: rank {rank} is on GPU {mine}, the sender on GPU {theirs}; "
                    "colocated ranks must share one GPU (CUDA_VISIBLE_DEVICES of the rollout and trainer actors)"
                )

    # --------------------------------------------------------------------------- buckets
    def send_bucket(self, flat: torch.Tensor):
        """Sender: deliver one flat bucket to every receiver. Returns a handle whose `wait()`
        must be called before the next bucket is sent (one transfer in flight at a time) and
        before the bucket's memory is reused; the broadcast overlaps the packing of the next one."""
        if self.transport == "broadcast":
            return _Pending(self._broadcast_async(flat, 0), flat)
        from torch.multiprocessing.reductions import reduce_tensor

        torch.cuda.current_stream(flat.device).synchronize()  # the bucket is written before it is read
        self.broadcast_object(reduce_tensor(flat))
        self.barrier()  # every receiver has copied the bucket: its memory may be reused
        return _Pending(None, flat)

    def recv_bucket(self, numel: int, dtype: torch.dtype):
        """Receiver: post the receipt of one flat bucket into memory this process owns; returns
        (tensor, handle): the tensor holds the bucket once `handle.wait()` returned, so the next
        bucket can be posted before this one is consumed."""
        if self.transport == "broadcast":
            flat = torch.empty(numel, dtype=dtype, device=self.device)
            return flat, _Pending(self._broadcast_async(flat, 0), flat)
        rebuild, args = self.broadcast_object()
        args = list(args)
        args[6] = self.device.index if self.device.index is not None else torch.cuda.current_device()
        shared = rebuild(*args)
        if shared.numel() != numel or shared.dtype != dtype:
            raise RuntimeError(f"ipc bucket of {shared.numel()} {shared.dtype}, expected {numel} {dtype}")
        flat = shared.clone()
        torch.cuda.current_stream(flat.device).synchronize()
        del shared
        self.barrier()
        return flat, _Pending(None, flat)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        self._broadcast_async(tensor, src).wait()
        return tensor

    def _broadcast_async(self, tensor: torch.Tensor, src: int):
        return self.pg.broadcast([tensor], self._opts(dist.BroadcastOptions, rootRank=src))

    def all_reduce_max(self, value: int) -> int:
        return int(self.all_reduce_max_(torch.tensor([value], dtype=torch.int64, device=self.control)).item())

    def all_reduce_max_(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise maximum over all ranks, in place (`values` lives on `control`)."""
        opts = self._opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.MAX)
        self.pg.allreduce([values], opts).wait()
        return values

    def broadcast_object(self, obj=None, src: int = 0):
        """Pickle `obj` on `src`, return the unpickled copy on every rank: one broadcast of a
        fixed-size message when it fits (a header, checksums), else a second one for the rest."""
        if self.rank == src:
            data = pickle.dumps(obj)
            # built in Python, not with torch ops: a CPU fill can wait milliseconds for idle threads
            message = bytearray(_MESSAGE_BYTES + 8)
            message[:8] = len(data).to_bytes(8, "little")
            head = data[:_MESSAGE_BYTES]
            message[8 : 8 + len(head)] = head
            self.broadcast(torch.frombuffer(message, dtype=torch.uint8).to(self.control), src)
            if len(data) > _MESSAGE_BYTES:
                rest = torch.frombuffer(bytearray(data[_MESSAGE_BYTES:]), dtype=torch.uint8)
                self.broadcast(rest.to(self.control), src)
            return obj
        message = torch.empty(_MESSAGE_BYTES + 8, dtype=torch.uint8, device=self.control)
        message = self.broadcast(message, src).cpu().numpy().tobytes()
        size = int.from_bytes(message[:8], "little")
        data = message[8 : 8 + min(size, _MESSAGE_BYTES)]
        if size > _MESSAGE_BYTES:
            rest = torch.empty(size - _MESSAGE_BYTES, dtype=torch.uint8, device=self.control)
            data += self.broadcast(rest, src).cpu().numpy().tobytes()
        return pickle.loads(data)

    def barrier(self) -> None:
        self.all_reduce_max(0)

    @staticmethod
    def _opts(cls, **values):
        opts = cls()
        for k, v in values.items():
            setattr(opts, k, v)
        return opts


class _Pending:
    """A bucket in flight: `wait()` orders the caller's stream after it (blocks on gloo) and
    releases the reference that kept its memory alive."""

    def __init__(self, work, tensor: torch.Tensor):
        self.work, self.tensor = work, tensor

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
        self.work = self.tensor = None
