"""Log-probs (and entropy) of the response tokens of a generation-layout batch, and a value
model's values of them.

Three equivalent layouts (`trainer.layout`, docs/token-layout.md): `packed` (real tokens only,
one row, position ids restarting per sequence, so transformers' attention keeps sequences apart:
flash-attn varlen on CUDA, a block-diagonal mask on CPU), `padded` (the `[B, P + R]` reference)
and `shared_prompt` (padded, but each distinct prompt of the micro-batch runs once: GRPO's n
samples of a prompt share its keys and values, and only the responses run per row). All return
`[B, R]` float32 tensors in the response layout; property tests hold them equal.
"""

from __future__ import annotations

import inspect

import torch

from rlpost.algos.losses import entropy_from_logits
from rlpost.data.batch import Batch
from rlpost.data.padding import (
    Packed,
    model_inputs,
    pack,
    response_logits,
    shifted,
    spread,
    token_logprobs,
    trim_padding,
    unpack_tokens,
)

LAYOUTS = ("packed", "padded", "shared_prompt")


def packed_forward(model, p: Packed, device, keep: dict | None = None):  # pragma: no mutate block (docstring)
    """The model on one packed row (`keep`: `{"logits_to_keep": positions}`, a causal LM's outputs
    at those positions only). The varlen arguments are read by flash-attention kernels (on a
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
        **{k: v.to(device) for k, v in (keep or {}).items()},
    )


def _forward_arguments(model) -> set[str]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    return set(inspect.signature(type(base).forward).parameters)


def _cache_keyword(model) -> str:
    """transformers 5 calls the key/value cache argument `cache`; 4.x `past_key_values`."""
    return "cache" if "cache" in _forward_arguments(model) else "past_key_values"


def keeps_logits(model) -> bool:
    """Whether the model's forward computes logits at chosen positions only (`logits_to_keep`, every
    causal LM of transformers 5): the log-probs then project no prompt position onto the vocabulary."""
    return "logits_to_keep" in _forward_arguments(model)


def outputs_before_responses(model, batch: Batch, share_prompts: bool, lm: bool = False):
    """The model's outputs (`.logits`) at the position before each response token, for a batch on
    the model's device, trimmed of padding: a list of pieces [B, r_k, ...] that lie side by side
    along the response axis (sum r_k = R; they are not concatenated: with a large vocabulary, a
    copy of the logits is gigabytes). Response token j is predicted at column P + j - 1 of the
    padded layout.

    With `share_prompts`, rows whose prompts are equal (tokens and padding) run that prompt once:
    one forward of the distinct prompts fills a key/value cache, the cache is gathered out to
    every row, and a second forward runs the responses on it. The prompt's last position
    predicts response token 0, the responses' own positions the rest. Autograd carries each
    row's gradient back through the gather to its prompt, so the gradient is the padded
    layout's too. It is always two forwards, whatever the rows hold: FSDP gathers the weights
    once per forward, and every rank must run as many. `lm`: a causal LM that `keeps_logits`, whose
    forwards then compute no logits that are never read (a prompt's, but for its last position)."""
    prompt_mask, response_mask = batch["prompt_mask"], batch["response_mask"]
    if not share_prompts:  # one forward over [B, P + R]
        input_ids, attention_mask, position_ids = model_inputs(batch)
        keep = {"logits_to_keep": response_mask.shape[1] + 1} if lm else {}  # columns P - 1 .. P + R - 1
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **keep
        )
        return [out.logits[:, :-1] if lm else response_logits(out.logits, prompt_mask.shape[1])]
    from transformers import DynamicCache

    key = torch.where(prompt_mask, batch["prompt_ids"], -1)
    distinct, row_prompt = torch.unique(key, dim=0, return_inverse=True)
    cache = DynamicCache(config=model.config)
    kv = {_cache_keyword(model): cache}
    distinct_mask = (distinct >= 0).long()
    first = model(
        input_ids=distinct.clamp(min=0),
        attention_mask=distinct_mask,
        position_ids=(distinct_mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        **kv,
        **({"logits_to_keep": 1} if lm else {}),
    ).logits[:, -1:][row_prompt]  # [B, 1, ...]: predicts response token 0
    cache.batch_select_indices(row_prompt)
    R = response_mask.shape[1]
    width = (0, max(R, 1) - R)  # no responses at all: one masked column, so the second forward still runs
    ids = torch.nn.functional.pad(batch["response_ids"], width)
    rest = model(
        input_ids=ids,
        attention_mask=torch.cat([prompt_mask, torch.nn.functional.pad(response_mask, width)], dim=1).long(),
        position_ids=prompt_mask.sum(-1, keepdim=True) + torch.arange(ids.shape[1], device=ids.device),
        use_cache=True,
        **kv,
    ).logits[:, : R - 1]
    return [first[:, :R], rest]


def response_logprobs(
    model, batch: Batch, temperature: float = 1.0, layout: str = "packed", with_entropy: bool = False
):
    """(log-probs [B, R], entropy [B, R] or None) of `batch`'s responses under `model`.

    Logits are divided by `temperature` first: the log-probs of the distribution the rollout
    sampled from."""
    device, lm = next(model.parameters()).device, keeps_logits(model)
    if layout == "packed":  # the logits of the positions before response tokens only: a prompt's are never read
        p = pack(batch)
        before = p.token_index[p.response_mask] - 1  # [K]: the position that predicts each response token
        out = packed_forward(model, p, device, {"logits_to_keep": before} if lm else None).logits[0]
        logits = (out if lm else out[before.to(device)]).float() / temperature  # [K, V]
        mask = p.response_mask.to(device)  # spread back to [B, R] below
        logp = spread(token_logprobs(logits, p.input_ids[0, before + 1].to(device)), mask)
        return logp, spread(entropy_from_logits(logits), mask) if with_entropy else None
    width = batch["response_ids"].shape[1]
    batch = trim_padding(batch).to(device)  # padded to this micro-batch's own longest rows
    logp, entropy, start = [], [], 0
    for piece in outputs_before_responses(model, batch, layout == "shared_prompt", lm):
        logits = piece.float() / temperature  # [B, r, V]
        end = start + logits.shape[1]
        logp.append(token_logprobs(logits, batch["response_ids"][:, start:end]))
        entropy.append(entropy_from_logits(logits) if with_entropy else None)
        start = end
    mask = batch["response_mask"]
    pad = (0, width - mask.shape[1])  # back to the caller's width R
    logp = torch.nn.functional.pad(torch.cat(logp, dim=1) * mask, pad)
    return logp, torch.nn.functional.pad(torch.cat(entropy, dim=1) * mask, pad) if with_entropy else None


def response_values(model, batch: Batch, layout: str = "packed") -> torch.Tensor:
    """A value model's values [B, R] of `batch`'s responses: entry j is the value of the state
    before response token j (read at the position just before it, as its log-prob is)."""
    device = next(model.parameters()).device
    if layout == "packed":
        p = pack(batch)
        out = packed_forward(model, p, device).logits[0, :, 0]  # [T]
        return unpack_tokens(shifted(out.float()), p)
    width = batch["response_ids"].shape[1]
    batch = trim_padding(batch).to(device)
    pieces = outputs_before_responses(model, batch, layout == "shared_prompt")
    values = torch.cat([piece[..., 0] for piece in pieces], dim=1).float() * batch["response_mask"]
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def resolve_layout(layout: str, attn_implementation: str, device: str) -> str:
    """`trainer.layout`: `auto` is packed with a varlen attention kernel; else shared_prompt on the
    CPU and padded on a GPU. With sdpa/eager, transformers turns a packed row into a dense [T, T]
    block-diagonal mask: quadratic in the tokens of a whole micro-batch, much slower than padding
    for many short sequences. On an H100, shared_prompt through transformers' key/value cache ran
    at 0.73x the padded layout's tokens/s even with 8 rows per 256-token prompt
    (`benchmarks/layouts_h100/`); on the CPU it takes 0.6x the padded layout's time."""
    if layout == "auto":
        if attn_implementation.startswith("flash_attention") or attn_implementation == "rlpost_varlen":
            return "packed"
        return "shared_prompt" if device == "cpu" else "padded"
    return layout
