"""The weight-sync checksum of many CUDA tensors in one Triton kernel, read where they lie.

Every sync checksums each bucket on the sender and, on each receiver, each bucket as it arrives
and everything the engine holds after loading. With torch ops that is a row-sum kernel and nine
more for the prefix sums per call, and tensors that are not one buffer must first be copied into
one. This kernel reads each tensor in place, found as an offset from a base pointer, and adds
each 1 KiB row's sum, weighted by its row number, to its tensor's checksum: the same value as
`checksums.checksums_of_rows` (integer sums wrap the same way in any order; the GPU tests compare
the two). It reads 16-byte words, so it takes tensors that are contiguous and start and end on
16 bytes (`direct`: all weights of usual shapes); the callers use torch ops for the others.
"""

from __future__ import annotations

import functools

import torch

_ROWS = 32  # rows of 1 KiB per program
_WORDS = 256  # 32-bit words per row


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def checksums(base, offsets, sizes, blocks, n_blocks, out, ROWS: tl.constexpr, WORDS: tl.constexpr):
        pid = tl.program_id(0)
        k = tl.load(blocks + pid)  # the tensor this program reads
        r0 = tl.load(blocks + n_blocks + pid)  # its first row there
        start = tl.load(offsets + k) * 4  # stored in 16-byte units: the loads are aligned
        words = tl.load(sizes + k) * 4
        rows = r0 + tl.arange(0, ROWS)
        at = rows[:, None] * WORDS + tl.arange(0, WORDS)[None, :]
        x = tl.load(base + start + at, mask=at < words, other=0)  # bytes past the end read as 0
        sums = tl.sum(x, axis=1)  # int32, wrapping like torch.sum(dtype=int32)
        weighted = tl.sum(sums.to(tl.int64) * (rows + 1).to(tl.int64), axis=0)
        tl.atomic_add(out + k, weighted, sem="relaxed")

    return checksums


@functools.cache
def available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401  (ships with CUDA builds of torch)
    except ImportError:
        return False
    return True


def direct(t: torch.Tensor) -> bool:
    """Whether the kernel can read `t` where it lies."""
    return t.is_contiguous() and t.data_ptr() % 16 == 0 and (t.numel() * t.element_size()) % 16 == 0


class Checksums:
    """Checksums of tensors of fixed sizes (bytes, each a multiple of 16) at offsets from a base
    tensor, called again and again: the table of programs lives on the device, built once."""

    def __init__(self, nbytes: list[int], device: torch.device, offsets: list[int] | None = None):
        rows = torch.tensor([-(-n // (4 * _WORDS)) for n in nbytes], dtype=torch.int64)
        per_tensor = -(-rows // _ROWS)
        tensor = torch.repeat_interleave(torch.arange(len(nbytes)), per_tensor)
        starts = torch.cumsum(per_tensor, 0) - per_tensor
        first = (torch.arange(len(tensor)) - starts[tensor]) * _ROWS
        self.blocks = torch.cat([tensor, first]).to(device)
        self.n_blocks = len(tensor)
        self.n = len(nbytes)
        self.sizes = torch.tensor([n // 16 for n in nbytes], dtype=torch.int64).to(device)
        self.offsets = torch.zeros(len(nbytes), dtype=torch.int64, device=device)
        self.sent: list[int] = []
        if offsets is not None:
            self.set_offsets(offsets)

    def set_offsets(self, offsets: list[int]) -> None:
        """Offsets in bytes (multiples of 16) from the base; sent to the device when they change
        (stream-ordered: a kernel queued before still reads the old ones)."""
        if offsets != self.sent:
            self.offsets.copy_(torch.tensor([o // 16 for o in offsets], dtype=torch.int64))
            self.sent = list(offsets)

    def __call__(self, base: torch.Tensor) -> torch.Tensor:
        """Queue the checksums of the tensors at the offsets from `base` (int32, 16-byte aligned)
        into a new int64 vector; no host synchronisation."""
        out = torch.zeros(self.n, dtype=torch.int64, device=base.device)
        if self.n_blocks:
            _kernel()[(self.n_blocks,)](
                base, self.offsets, self.sizes, self.blocks, self.n_blocks, out, ROWS=_ROWS, WORDS=_WORDS, num_warps=4
            )
        return out
