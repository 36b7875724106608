"""The one place that converts between token layouts (see docs/token-layout.md).

Generation layout: `prompt_ids [B, P]` left-padded, `response_ids [B, R]` right-padded; every
per-token quantity is stored `[B, R]`.

Padded model layout: the concatenation `[B, P + R]` of the two. Because every prompt is
left-padded to the same width P, response token j of every row sits at column P + j, and its
log-prob is read from the logits at column P + j - 1 (the position just before it). Position ids
count real tokens only, so padding never shifts a sequence's positions.

Packed model layout: the real tokens of every row, prompt then response, back to back in one
row `[1, T]` (T = total real tokens), position ids restarting at 0 for each sequence and
`cu_seqlens [B + 1]` marking where each starts. No padding is computed at all. Response token j
of row i sits at `cu_seqlens[i] + prompt_len[i] + j`; its log-prob again comes from the logits
one position earlier, which always lies inside the same sequence (a prompt has >= 1 token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlpost.data.batch import Batch


def left_pad(rows: list[list[int]], pad_id: int, width: int | None = None):
    """Token lists -> (ids [B, W] left-padded, mask [B, W] bool)."""
    width = max([len(r) for r in rows] + [0]) if width is None else width
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"row {i} has {len(r)} tokens, more than the width {width}")
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = True
    return ids, mask


def right_pad(rows: list[list[float]] | list[list[int]], pad, width: int | None = None, dtype=torch.long):
    """Lists -> (values [B, W] right-padded with `pad`, mask [B, W] bool)."""
    width = max([len(r) for r in rows] + [0]) if width is None else width
    out = torch.full((len(rows), width), pad, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"row {i} has {len(r)} entries, more than the width {width}")
        if len(r):
            out[i, : len(r)] = torch.as_tensor(r, dtype=dtype)
            mask[i, : len(r)] = True
    return out, mask


def response_mask_from_eos(response_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Mask [B, R] of real response tokens: everything up to and including the first EOS."""
    is_eos = (response_ids == eos_id).long()
    return (is_eos.cumsum(-1) - is_eos) == 0


def generated_responses(sequences: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """`generate` output [B, P + R] (prompts left-padded to P) -> the response part [B, R]."""
    return sequences[:, prompt_width:]


def model_inputs(batch: Batch):
    """Generation layout -> padded model inputs `input_ids, attention_mask, position_ids`, [B, P+R]."""
    input_ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["response_mask"]], dim=1).long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def response_logits(logits: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """Logits [B, P+R, V] -> the logits that predict each response token, [B, R, V].

    Shift by one: response token j (column P + j) is predicted at column P + j - 1."""
    return logits[:, prompt_width - 1 : -1]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] for every position: [B, R, V], [B, R] -> [B, R] (float32)."""
    logits = logits.float()
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def check_masks(batch: Batch) -> None:
    """`response_mask` marks a prefix of each row (responses are right-padded); `loss_mask` may
    have holes (tokens a tool or an environment wrote) but lies inside it."""
    response, loss = batch["response_mask"], batch["loss_mask"]
    lengths = response.sum(-1)
    if not torch.equal(response, torch.arange(response.shape[1]) < lengths[:, None]):
        raise ValueError("response_mask must mark a prefix of each row (responses are right-padded)")
    outside = loss & ~response
    if outside.any():
        raise ValueError(f"row {int(outside.any(-1).nonzero()[0])}: loss_mask marks tokens outside response_mask")


def concat_generations(batches: list[Batch], pad_id: int) -> Batch:
    """Concatenate generation batches of different prompt/response widths by re-padding
    prompts on the left and per-token tensors on the right to the widest."""
    P = max(b["prompt_ids"].shape[1] for b in batches)
    R = max(b["response_ids"].shape[1] for b in batches)
    out = []
    for b in batches:
        t = dict(b.tensors)
        dp, dr = P - t["prompt_ids"].shape[1], R - t["response_ids"].shape[1]
        for k, v in t.items():
            if k.startswith("prompt_"):
                fill = pad_id if k == "prompt_ids" else 0
                t[k] = torch.nn.functional.pad(v, (dp, 0), value=fill)
            elif v.dim() == 2 and v.shape[1] == b["response_ids"].shape[1]:
                fill = pad_id if k == "response_ids" else 0
                t[k] = torch.nn.functional.pad(v, (0, dr), value=fill)
        out.append(Batch(t))
    return Batch.cat(out)


# ------------------------------------------------------------------------------ packed layout
@dataclass
class Packed:
    """A batch in the packed layout, plus what is needed to go back to `[B, R]`."""

    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T], restarting at 0 per sequence
    cu_seqlens: torch.Tensor  # [B + 1] int32, sequence i is [cu[i], cu[i+1])
    token_index: torch.Tensor  # [B, R] long: packed position of response token (i, j); 0 where padded
    response_mask: torch.Tensor  # [B, R] bool

    @property
    def max_seqlen(self) -> int:
        return int((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).max()) if len(self.cu_seqlens) > 1 else 0


def pack(batch: Batch) -> Packed:
    """Generation layout -> packed layout (real tokens only)."""
    prompt_mask, response_mask = batch["prompt_mask"], batch["response_mask"]
    prompt_lens, response_lens = prompt_mask.sum(-1), response_mask.sum(-1)
    if (prompt_lens == 0).any():
        raise ValueError(f"row {int((prompt_lens == 0).nonzero()[0])} has an empty prompt")
    if not torch.equal(response_mask, torch.arange(response_mask.shape[1]) < response_lens[:, None]):
        raise ValueError("response_mask must mark a prefix of each row (responses are right-padded)")
    seqlens = prompt_lens + response_lens
    cu = torch.zeros(len(seqlens) + 1, dtype=torch.int32)
    cu[1:] = seqlens.cumsum(0)
    # real tokens in row order: left-padded prompt tokens, then right-padded response tokens
    tokens = torch.cat([batch["prompt_ids"], batch["response_ids"]], dim=1)
    real = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = tokens[real]
    starts = torch.repeat_interleave(cu[:-1].long(), seqlens)
    position_ids = torch.arange(len(input_ids)) - starts
    j = torch.arange(response_mask.shape[1])
    token_index = (cu[:-1].long() + prompt_lens)[:, None] + j[None, :]
    token_index = torch.where(response_mask, token_index, torch.zeros_like(token_index))
    return Packed(input_ids[None], position_ids[None], cu, token_index, response_mask)


def spread(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Values [K] of the masked entries, in row order -> [B, R] (0 elsewhere); `mask` [B, R] bool."""
    out = values.new_zeros(mask.shape)
    out[mask] = values
    return out


def shifted(per_position: torch.Tensor) -> torch.Tensor:
    """[T, ...] computed from logits at each position -> aligned with the token it predicts."""
    out = torch.zeros_like(per_position)
    out[1:] = per_position[:-1]
    return out


def unpack_tokens(values: torch.Tensor, packed: Packed) -> torch.Tensor:
    """Per-token packed values [T] -> response layout [B, R] (0 on padding)."""
    out = values[packed.token_index.to(values.device)]
    return out * packed.response_mask.to(out.device)


def pack_tokens(values: torch.Tensor, packed: Packed) -> torch.Tensor:
    """Response layout [B, R] -> packed [T] (0 on prompt tokens); inverse of `unpack_tokens`."""
    T = packed.input_ids.shape[1]
    out = torch.zeros(T, dtype=values.dtype, device=values.device)
    out[packed.token_index[packed.response_mask]] = values[packed.response_mask]
    return out


def trim_padding(batch: Batch) -> Batch:
    """Drop prompt columns that are padding in every row (left) and response columns that are
    padding in every row (right): a micro-batch padded only to its own longest row."""
    keep_p = int(batch["prompt_mask"].sum(-1).max()) if len(batch) else 0
    keep_r = int(batch["response_mask"].sum(-1).max()) if len(batch) else 0
    P, R = batch["prompt_ids"].shape[1], batch["response_ids"].shape[1]
    out = {}
    for k, v in batch.tensors.items():
        if k.startswith("prompt_") and v.dim() == 2 and v.shape[1] == P:
            out[k] = v[:, P - keep_p :]
        elif v.dim() == 2 and v.shape[1] == R:
            out[k] = v[:, :keep_r]
        else:
            out[k] = v
    return Batch(out)
