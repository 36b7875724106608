"""AdamW with host-resident states, stepped on the parameters' device one FSDP unit at a time.

`trainer.optim.offload=layerwise` (after verl PR #5364 and AReaL's per-layer optimizer wrapper):
Adam's two moment tensors live in pinned host memory, one flat buffer per FSDP unit. A step walks
the units in order over three CUDA streams created once per run: the host-to-device stream
copies unit i + k's states into a reusable device slot (k = `prefetch_layers`), the compute stream
runs AdamW on unit i's local shards (parameters and gradients never leave the device), and the
device-to-host stream writes unit i's new states back. Only `prefetch_layers + 1` units' states
are on the device at any time, and only during a step: the slots are made for each step and let go
after it (a colocated rollout engine wakes into that memory; at 7B the largest unit, the
embeddings, makes two slots 17 GB). On the CPU the same grouping and update code runs with no
streams.

The update is torch's AdamW (decoupled weight decay, bias correction), operation for operation
as `torch.optim.AdamW(foreach=False)` computes it, with the states in the parameters' dtype:
    p *= 1 - lr * wd;  m = lerp(m, g, 1 - b1);  v = b2 v + (1 - b2) g^2
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
Step counters are Python numbers on the host (no device synchronisation per parameter).
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

_CHUNK = 1 << 22  # elements per update chunk: bounds the temporaries to a few MB per slot


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def shard_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """The rows [lo, hi) of a dim-0 size `rows` that FSDP2 gives `rank` of `world` (torch.chunk:
    ceil(rows / world) each, the last ones shorter or empty)."""
    size = -(-rows // world)
    return min(rank * size, rows), min((rank + 1) * size, rows)


def reshard_host_states(saved: list[list[torch.Tensor]], shapes: list[list[torch.Size]], rank: int, world: int):
    """The host states of `rank` of `world` from those saved by another number of ranks:
    `saved[r][i]` is old rank r's [exp_avg | exp_avg_sq] of unit i, `shapes[i]` the full shapes of
    unit i's parameters in order. Each parameter's moments are put back together from the old
    ranks' rows and cut again for the new rank."""
    out = []
    for i, unit in enumerate(shapes):
        per_row = [math.prod(s[1:]) for s in unit]
        halves: list[list[list[torch.Tensor]]] = [[[] for _ in unit] for _ in range(2)]  # [half][param] -> pieces
        for r, hosts in enumerate(saved):
            sizes = [(hi - lo) * row for s, row in zip(unit, per_row) for lo, hi in [shard_rows(s[0], r, len(saved))]]
            n = sum(sizes)
            for half, flat in enumerate((hosts[i][:n], hosts[i][n:])):
                for j, piece in enumerate(flat.split(sizes)):
                    halves[half][j].append(piece)
        mine = []
        for half in range(2):
            for j, (s, row) in enumerate(zip(unit, per_row)):
                lo, hi = shard_rows(s[0], rank, world)
                mine.append(torch.cat(halves[half][j])[lo * row : hi * row])
        out.append(torch.cat(mine))
    return out


class LayerwiseAdamW(torch.optim.Optimizer):
    def __init__(
        self,
        units: list[list[torch.nn.Parameter]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        prefetch_layers: int = 1,
    ):
        params = [p for unit in units for p in unit]
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter appears in two units")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})
        self.units = [list(u) for u in units if u]
        self.prefetch = max(0, int(prefetch_layers))
        self.device = local(params[0]).device
        cuda = self.device.type == "cuda"
        self.numels = [sum(local(p).numel() for p in u) for u in self.units]
        # states in the parameters' dtype, as torch's AdamW keeps them
        self.dtype = local(params[0]).dtype
        if any(local(p).dtype != self.dtype for p in params):
            raise ValueError(
                f"LayerwiseAdamW needs one parameter dtype; found {sorted({str(local(p).dtype) for p in params})}"
            )
        # host states: [exp_avg | exp_avg_sq] per unit, pinned when a GPU reads them
        self.host = [torch.zeros(2 * n, dtype=self.dtype, pin_memory=cuda) for n in self.numels]
        self.slot_count = min(self.prefetch + 1, len(self.units))  # device slots of one step (`_slots`)
        self.steps = 0  # host-side step counter (all groups step together)
        if cuda:
            self.h2d, self.compute, self.d2h = (torch.cuda.Stream(self.device) for _ in range(3))
            self.loaded = [torch.cuda.Event() for _ in range(self.slot_count)]
            self.updated = [torch.cuda.Event() for _ in range(self.slot_count)]
            self.freed = [torch.cuda.Event() for _ in range(self.slot_count)]
        self._group_of = {id(p): g for g in self.param_groups for p in g["params"]}

    # ------------------------------------------------------------------------------------ step
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("LayerwiseAdamW does not take a closure")
        self.steps += 1
        with torch.no_grad():
            if self.device.type == "cuda":
                self._step_streams(self._slots(self.slot_count))
            else:
                buffer = self._slots(1)[0]
                for i, unit in enumerate(self.units):
                    slot = buffer[: 2 * self.numels[i]]
                    slot.copy_(self.host[i])
                    self._update_unit(unit, slot)
                    self.host[i].copy_(slot)

    def _slots(self, count: int) -> list[torch.Tensor]:
        """`count` device buffers for one step, each the largest unit's two moments."""
        return [torch.empty(2 * max(self.numels), dtype=self.dtype, device=self.device) for _ in range(count)]

    def _step_streams(self, buffers: list[torch.Tensor]):  # pragma: no mutate block (CUDA only: tests/gpu/...)
        # the buffers go back to the allocator when this returns: the current stream waits for the
        # side streams below, so no later kernel of it can touch them before the copies are done
        n, slots = len(self.units), len(buffers)
        current = torch.cuda.current_stream(self.device)
        self.compute.wait_stream(current)  # gradients are ready
        # the slots were just allocated on the current stream: memory its queued kernels may still use
        # (a block freed there is handed out again at once); the first copy into them waits for those
        self.h2d.wait_stream(current)
        self.h2d.wait_stream(self.d2h)  # last step's states are all back on the host
        loaded_up_to = -1
        for i, unit in enumerate(self.units):
            while loaded_up_to < min(i + self.prefetch, n - 1):
                j = loaded_up_to = loaded_up_to + 1
                s = j % slots
                with torch.cuda.stream(self.h2d):
                    self.h2d.wait_event(self.freed[s])  # the slot's previous unit is written back
                    buffers[s][: 2 * self.numels[j]].copy_(self.host[j], non_blocking=True)
                    self.loaded[s].record(self.h2d)
            s = i % slots
            slot = buffers[s][: 2 * self.numels[i]]
            with torch.cuda.stream(self.compute):
                self.compute.wait_event(self.loaded[s])
                self._update_unit(unit, slot)
                self.updated[s].record(self.compute)
            with torch.cuda.stream(self.d2h):
                self.d2h.wait_event(self.updated[s])
                self.host[i].copy_(slot, non_blocking=True)
                self.freed[s].record(self.d2h)
        current.wait_stream(self.compute)  # parameters are updated before the next forward
        current.wait_stream(self.d2h)

    def _update_unit(self, unit: list[torch.nn.Parameter], slot: torch.Tensor) -> None:
        half = slot.numel() // 2
        exp_avg_all, exp_avg_sq_all = slot[:half], slot[half:]
        offset = 0
        for p in unit:
            w = local(p)
            n = w.numel()
            if p.grad is not None:
                g = self._group_of[id(p)]
                self._adamw(
                    w.view(-1),
                    local(p.grad).view(-1),
                    exp_avg_all[offset : offset + n],
                    exp_avg_sq_all[offset : offset + n],
                    g,
                )
            offset += n

    def _adamw(self, param, grad, exp_avg, exp_avg_sq, group) -> None:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        t = self.steps
        step_size = lr / (1 - beta1**t)
        bias_correction2_sqrt = (1 - beta2**t) ** 0.5
        for start in range(0, param.numel(), _CHUNK):
            p, g = param[start : start + _CHUNK], grad[start : start + _CHUNK]
            m, v = exp_avg[start : start + _CHUNK], exp_avg_sq[start : start + _CHUNK]
            if wd:
                p.mul_(1 - lr * wd)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
            p.addcdiv_(m, denom, value=-step_size)

    # ------------------------------------------------------------------------------ checkpoint
    def state_dict(self):
        """This rank's host states (local shards) and the step count."""
        return {
            "steps": self.steps,
            "host": [h.clone() for h in self.host],
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups],
        }

    def full_shapes(self) -> list[list[torch.Size]]:
        """Each unit's parameters' full (unsharded) shapes, in order."""
        return [[p.shape for p in u] for u in self.units]

    def load_state_dict(self, state):
        if [h.numel() for h in state["host"]] != [h.numel() for h in self.host]:
            raise ValueError("optimizer checkpoint was saved for a different model or world size")
        self.steps = int(state["steps"])
        for h, saved in zip(self.host, state["host"]):
            h.copy_(saved)  # into the existing (pinned) buffers: re-pinned by construction
        for g, saved in zip(self.param_groups, state["param_groups"]):
            g.update(saved)
