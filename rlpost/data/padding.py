"""The one place that converts between token layouts (see docs/token-layout.md).

Generation layout: `prompt_ids [B, P]` left-padded, `response_ids [B, R]` right-padded; every
per-token quantity is stored `[B, R]`.

Model layout (padded): the concatenation `[B, P + R]` of the two. Because every prompt is
left-padded to the same width P, response token j of every row sits at column P + j, and its
log-prob is read from the logits at column P + j - 1 (the position just before it). Position ids
count real tokens only, so padding never shifts a sequence's positions.
"""

from __future__ import annotations

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
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = True
    return ids, mask


def right_pad(rows: list[list[float]] | list[list[int]], pad, width: int | None = None,
              dtype=torch.long):
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


def response_mask_from_eos(response_ids: torch.Tensor, eos_id: int, lengths: torch.Tensor | None = None):
    """Mask [B, R] of real response tokens: everything up to and including the first EOS
    (and within `lengths`, when the generator reports them)."""
    is_eos = response_ids == eos_id
    before_eos = (is_eos.long().cumsum(-1) - is_eos.long()) == 0
    mask = before_eos
    if lengths is not None:
        mask = mask & (torch.arange(response_ids.shape[1]) < lengths[:, None])
    return mask


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
