"""The actor's weights for the rollouts: the manifest of each sync kind the run sends, the tensors
of one kind gathered from the FSDP shards (full, LoRA merged, base, adapter), and the send from
the ranks that send (`rlpost.weightsync`)."""

from __future__ import annotations

import torch

from rlpost.config import TrainConfig
from rlpost.models.lora import ADAPTER_DTYPE, adapter_named_parameters, base_named_parameters
from rlpost.trainer.engine import FSDPEngine
from rlpost.trainer.fsdp import full_tensor
from rlpost.trainer.lora import adapter_weights, base_weights, merged_weights
from rlpost.weightsync.checksums import checksum
from rlpost.weightsync.kinds import sync_kinds
from rlpost.weightsync.manifest import Manifest, spec_of
from rlpost.weightsync.sync import SyncStats, send_weights
from rlpost.weightsync.transport import SyncGroup, stacks_if_stuck


def manifests(model, lora, dtype: torch.dtype) -> dict[str, Manifest]:
    """The manifest of each sync kind a run with `lora` (None: full fine-tuning) sends."""

    def meta(named, dtype):
        return [spec_of(n, torch.empty(p.shape, dtype=dtype, device="meta")) for n, p in named]

    if lora is None:
        return {"full": meta(model.named_parameters(), dtype)}
    base = meta(base_named_parameters(model), dtype)
    if lora.mode == "merge":
        return {"merged": base}
    return {"base": base, "adapter": meta(adapter_named_parameters(model), ADAPTER_DTYPE)}


class ActorWeights:
    def __init__(self, cfg: TrainConfig, engine: FSDPEngine):
        self.cfg, self.engine = cfg, engine
        self.model, self.lora, self.device = engine.model, engine.lora, engine.device
        self.manifests = manifests(self.model, self.lora, engine.compute_dtype)
        self.group: SyncGroup | None = None

    def join(self, host: str, port: int, world_size: int, transport: str) -> None:
        """Called on the ranks that send (rank 0; with the ipc transport every rank that shares
        its GPU with a rollout actor)."""
        timeout = self.cfg.weight_sync.timeout_s
        self.group = SyncGroup(host, port, 0, world_size, str(self.device), timeout, transport)

    def export(self, kind: str):
        """The full tensors of one sync `kind`, in its manifest's order (a generator of
        collectives: every rank runs it to the end)."""
        if kind not in self.manifests:
            raise ValueError(
                f"weight sync kind {kind!r} does not fit this run (model.lora.rank="
                f"{self.cfg.model.lora.rank}, mode={self.cfg.model.lora.mode}): it sends "
                f"{sorted(self.manifests)}"
            )
        dtype = self.engine.compute_dtype
        if kind == "full":
            # `.to(device)`: with `optim.offload=cpu` FSDP keeps the shards on the host for good
            return (full_tensor(p.detach().to(self.device)).to(dtype) for _, p in self.model.named_parameters())
        # merged: W + scale B A computed out of place per parameter; the shards are never written
        named = {
            "merged": lambda: merged_weights(self.model, dtype),
            "base": lambda: base_weights(self.model, dtype),
            "adapter": lambda: adapter_weights(self.model, ADAPTER_DTYPE),
        }[kind]()
        return (t for _, t in named)

    def push(self, version: int, keep_on_gpu: bool = False, kind: str | None = None) -> SyncStats | None:
        """All ranks gather full tensors (FSDP all-gather); the ranks that send send them to the
        rollouts. `kind` (`rlpost.weightsync.kinds`; default: the one that carries the whole
        model) says what the sync carries. Offloaded shards (`trainer.param_offload`) come to the
        device for the gather and go back afterwards unless `keep_on_gpu`. Returns the sync's
        stats (None on a rank that does not send)."""
        kind = kind or sync_kinds(self.cfg, first=True)[0]
        timeout = self.cfg.weight_sync.timeout_s
        with stacks_if_stuck(timeout / 2), self.engine.resident(self.model, keep=keep_on_gpu):
            tensors = self.export(kind)
            if self.group is None:  # this rank only takes part in the gathers
                for _ in tensors:
                    pass
                return None
            ws = self.cfg.weight_sync
            cuda = self.device.type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
                before = torch.cuda.memory_allocated(self.device)
            stats = send_weights(self.group, self.manifests[kind], tensors, version, ws.bucket_mb * 2**20, ws.verify)
        if cuda:  # what the export needs beyond the trainer's own memory (gathers, buckets)
            stats.peak_bytes = torch.cuda.max_memory_allocated(self.device) - before
        return stats

    def base_checksums(self) -> list[int]:
        """Checksums of this rank's shards of the base (non-adapter) parameters: syncs and LoRA
        updates must leave them bitwise as they were."""
        named = base_named_parameters(self.model) if self.lora is not None else self.model.named_parameters()
        return [checksum(p.detach().to_local() if hasattr(p, "to_local") else p.detach()) for _, p in named]
