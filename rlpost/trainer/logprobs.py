"""Log-probs (and entropy) of the response tokens of a generation-layout batch, and a value
model's values of them.

Two equivalent paths: `packed` (the default: real tokens only, one row, position ids restarting
per sequence, so transformers' attention keeps sequences apart: flash-attn varlen on CUDA, a
block-diagonal mask on CPU) and `padded` (the `[B, P + R]` reference). Both return `[B, R]`
float32 tensors in the response layout; property tests hold them equal.
"""

from __future__ import annotations

import torch

from rlpost.algos.losses import entropy_from_logits
from rlpost.data.batch import Batch
from rlpost.data.padding import (
    Packed,
    model_inputs,
    pack,
    response_logits,
    shifted,
    shifted_token_logprobs,
    token_logprobs,
    trim_padding,
    unpack_tokens,
)


def packed_forward(model, p: Packed, device):  # pragma: no mutate block (see the docstring)
    """The model on one packed row. The varlen arguments are read by flash-attention kernels (on a
    GPU: tests/gpu/test_varlen_logprobs.py); on the CPU transformers keeps the sequences apart by
    their position ids alone, so no CPU test can tell them missing, and `.to(device)` is a no-op."""
    cu = p.cu_seqlens.to(device)
    return model(
        input_ids=p.input_ids.to(device),
        position_ids=p.position_ids.to(device),
        use_cache=False,
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=p.max_seqlen,
        max_length_k=p.max_seqlen,
    )


def response_logprobs(model, batch: Batch, temperature: float = 1.0, packed: bool = True, with_entropy: bool = False):
    """(log-probs [B, R], entropy [B, R] or None) of `batch`'s responses under `model`.

    Logits are divided by `temperature` first: the log-probs of the distribution the rollout
    sampled from."""
    device = next(model.parameters()).device
    if packed:
        p = pack(batch)
        logits = packed_forward(model, p, device).logits[0].float() / temperature  # [T, V]
        logp = unpack_tokens(shifted_token_logprobs(logits, p.input_ids[0].to(device)), p)
        entropy = unpack_tokens(shifted(entropy_from_logits(logits)), p) if with_entropy else None
        return logp, entropy
    width = batch["response_ids"].shape[1]
    batch = trim_padding(batch).to(device)  # padded to this micro-batch's own longest rows
    input_ids, attention_mask, position_ids = model_inputs(batch)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).logits
    logits = response_logits(logits, batch["prompt_ids"].shape[1]).float() / temperature  # [B, R', V]
    mask = batch["response_mask"]
    pad = (0, width - mask.shape[1])  # back to the caller's width R
    logp = torch.nn.functional.pad(token_logprobs(logits, batch["response_ids"]) * mask, pad)
    entropy = torch.nn.functional.pad(entropy_from_logits(logits) * mask, pad) if with_entropy else None
    return logp, entropy


def response_values(model, batch: Batch, packed: bool = True) -> torch.Tensor:
    """A value model's values [B, R] of `batch`'s responses: entry j is the value of the state
    before response token j (read at the position just before it, as its log-prob is)."""
    device = next(model.parameters()).device
    if packed:
        p = pack(batch)
        out = packed_forward(model, p, device).logits[0, :, 0]  # [T]
        return unpack_tokens(shifted(out.float()), p)
    width = batch["response_ids"].shape[1]
    batch = trim_padding(batch).to(device)
    input_ids, attention_mask, position_ids = model_inputs(batch)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False).logits
    values = response_logits(out, batch["prompt_ids"].shape[1])[..., 0].float() * batch["response_mask"]
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def use_packed_layout(layout: str, attn_implementation: str) -> bool:
    """`trainer.layout`: `auto` is packed only with a varlen attention kernel. With sdpa/eager,
    transformers turns a packed row into a dense [T, T] block-diagonal mask: quadratic in the
    tokens of a whole micro-batch, much slower than padding for many short sequences."""
    if layout == "auto":
        return attn_implementation.startswith("flash_attention") or attn_implementation == "rlpost_varlen"
    return layout == "packed"
