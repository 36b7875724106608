"""Which part of a Hugging Face tensor one tensor-parallel shard of a vLLM engine holds, and where
in its parameter: pure arithmetic on the sizes of the layer that holds it, so that a shard's
weights can be read back and checked against the bytes the trainer sent.

vLLM splits a layer over its `tp_size` shards in one of four ways:

- `whole`: every shard holds all of it (norms, `ReplicatedLinear`, a row-parallel layer's bias);
- `column` (`ColumnParallelLinear`, and the fused `MergedColumnParallelLinear` gate/up and
  `QKVParallelLinear` q/k/v): shard r holds rows [r L, (r + 1) L) of each piece, the pieces one
  after another. With fewer key/value heads than shards, `kv_replicas` shards hold the same heads;
- `row` (`RowParallelLinear`): shard r holds columns [r L, (r + 1) L) of the weight;
- `vocab` (`VocabParallelEmbedding`, `ParallelLMHead`): shard r holds the vocabulary's rows
  [first, end) at its start, padding after them.

At tp_size 1 the rules give the fused pieces' places (q, k, v one after another in `qkv_proj`).
`tests/rollout/test_vllm_shards.py` checks them against vLLM's own weight loaders.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# HF projections that vLLM fuses into one parameter, and their order inside it
FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


@dataclass(frozen=True)
class Layer:
    """What the rules need of one vLLM module."""

    kind: str = "whole"  # whole, column, row or vocab
    tp_rank: int = 0
    tp_size: int = 1
    kv_replicas: int = 1  # q/k/v: shards that hold the same key/value heads
    rows: tuple[int, int] | None = None  # vocab: this shard's (first, end) rows of the vocabulary


@dataclass(frozen=True)
class Slice:
    """Along `dim`, `length` elements: from `held` in the vLLM parameter, from `full` in the HF tensor."""

    dim: int
    held: int
    full: int
    length: int


def layer_of(module) -> Layer:
    """The rule's view of a vLLM module (a LoRA wrapper's `base_layer` is the layer)."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    module = getattr(module, "base_layer", module)
    rank, size = getattr(module, "tp_rank", 0), getattr(module, "tp_size", 1)
    if isinstance(module, VocabParallelEmbedding):
        s = module.shard_indices
        return Layer("vocab", rank, size, rows=(s.org_vocab_start_index, s.org_vocab_end_index))
    if isinstance(module, QKVParallelLinear):
        return Layer("column", rank, size, kv_replicas=module.num_kv_head_replicas)
    if isinstance(module, ColumnParallelLinear):
        return Layer("column", rank, size)
    if isinstance(module, RowParallelLinear):
        return Layer("row", rank, size)
    return Layer()


def shard_slice(layer: Layer, shape: tuple[int, ...], pieces: list[int] | None = None, piece: int = 0) -> Slice | None:
    """The slice of an HF tensor of `shape` that shard `layer.tp_rank` holds. `pieces`: the first
    dimension of each HF tensor fused into the parameter (q, k, v or gate, up), `piece` the index
    of this one; None for an unfused tensor. None where the sizes do not divide as vLLM's would."""
    t, r = layer.tp_size, layer.tp_rank
    if layer.kind == "whole" or (layer.kind == "row" and len(shape) == 1):  # a row layer's bias is whole
        return Slice(0, 0, 0, shape[0])
    if layer.kind == "vocab":
        first, end = layer.rows
        return Slice(0, 0, first, end - first) if 0 <= first <= end <= shape[0] else None
    if layer.kind == "row":
        return Slice(1, 0, r * (shape[1] // t), shape[1] // t) if shape[1] % t == 0 else None
    pieces = pieces or [shape[0]]
    replicas = [1] + [layer.kv_replicas] * (len(pieces) - 1) if len(pieces) == 3 else [1] * len(pieces)
    if any((size * k) % t for size, k in zip(pieces, replicas)):
        return None
    held = [size * k // t for size, k in zip(pieces, replicas)]  # each piece's rows on one shard
    owner = r // replicas[piece]  # which block of the full tensor this shard's piece is
    return Slice(0, sum(held[:piece]), owner * held[piece], held[piece])


def fused_name(hf_name: str) -> tuple[str, int | None]:
    """(the vLLM parameter's name, the piece's index in it or None) of HF tensor `hf_name`."""
    parts = hf_name.split(".")
    if len(parts) >= 2 and parts[-2] in FUSED:
        fused, piece = FUSED[parts[-2]]
        return ".".join(parts[:-2] + [fused, parts[-1]]), piece
    return hf_name, None


def siblings(hf_name: str) -> list[str]:
    """The HF tensors fused with `hf_name` into one vLLM parameter, in their order ([hf_name] if none)."""
    parts = hf_name.split(".")
    if len(parts) < 2 or parts[-2] not in FUSED:
        return [hf_name]
    fused = FUSED[parts[-2]][0]
    return [".".join(parts[:-2] + [k, parts[-1]]) for k, (f, _) in FUSED.items() if f == fused]


def held_part(held: torch.Tensor, s: Slice, shape: tuple[int, ...]) -> torch.Tensor | None:
    """The part of vLLM's parameter `held` that holds slice `s` of an HF tensor of `shape`, or None
    where `held` is in a layout the slice does not fit (a kernel's repacked weights)."""
    want = list(shape)
    want[s.dim] = s.length
    if held.dim() != len(shape) or s.held + s.length > held.shape[s.dim]:
        return None
    if any(held.shape[d] != want[d] for d in range(len(shape)) if d != s.dim):
        return None
    return held.narrow(s.dim, s.held, s.length)
