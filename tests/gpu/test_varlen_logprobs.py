"""On a GPU: the packed layout through PyTorch's varlen FlashAttention (`rlpost_varlen`) gives
the same response log-probs as the padded sdpa path and the per-sequence reference."""

import pytest
import torch

from rlpost.data.batch import Batch
from rlpost.data.padding import left_pad, right_pad
from rlpost.models import varlen
from rlpost.trainer.logprobs import response_logprobs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype, atol", [(torch.bfloat16, 0.1), (torch.float16, 0.02)])
def test_varlen_packed_matches_padded(dtype, atol):
    if not varlen.varlen_available():
        pytest.skip("torch has no varlen_attn")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=512,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        max_position_embeddings=512,
    )
    model = Qwen2ForCausalLM(cfg).to("cuda", dtype).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (int(n),), generator=g).tolist() for n in torch.randint(1, 40, (12,), generator=g)]
    responses = [
        torch.randint(3, 512, (int(n),), generator=g).tolist() for n in torch.randint(0, 60, (12,), generator=g)
    ]
    pi, pm = left_pad(prompts, 0)
    ri, rm = right_pad(responses, 0)
    batch = Batch({"prompt_ids": pi, "prompt_mask": pm, "response_ids": ri, "response_mask": rm})
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        padded, _ = response_logprobs(model, batch, 1.0, layout="padded")
        model.set_attn_implementation(varlen.register())
        packed, _ = response_logprobs(model, batch, 1.0, layout="packed")
    assert torch.isfinite(packed).all()
    assert (packed - padded).abs().max().item() <= atol
