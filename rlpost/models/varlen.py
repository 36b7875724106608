"""`rlpost_varlen`: packed-sequence attention through PyTorch's built-in FlashAttention varlen
kernel (`torch.nn.attention.varlen.varlen_attn`, CUDA), for machines without the flash-attn
package. Registered with transformers as an attention implementation; the packed forward passes
`cu_seq_lens_q/k` and `max_length_q/k`, as it does for flash_attention_2.
"""

from __future__ import annotations

import torch

NAME = "rlpost_varlen"


def varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    from torch.nn.attention.varlen import varlen_attn

    if query.shape[0] != 1:
        raise ValueError(f"{NAME} runs packed batches of one row; got batch size {query.shape[0]}")
    cu = kwargs["cu_seq_lens_q"].to(torch.int32)
    max_len = int(kwargs["max_length_q"])
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # [T, H, D]
    if k.shape[1] != q.shape[1]:  # grouped-query attention: repeat key/value heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scaling, window_size=(-1, 0))
    return out[None], None  # [1, T, H, D]


def register() -> str:
    """Make `attn_implementation="rlpost_varlen"` available to transformers models."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(NAME, _attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, flash_attention_mask)
    return NAME
