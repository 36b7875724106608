"""The log-probs project onto the vocabulary only the positions whose logits they read: no prompt
position but each prompt's last (the update's largest tensors are these [positions, vocabulary]
logits in float32, and a prompt is often longer than its response). A model whose forward takes
no `logits_to_keep` gets the same log-probs from all its logits."""

import pytest
import torch

from rlpost.data.batch import Batch
from rlpost.data.padding import left_pad, right_pad
from rlpost.trainer.logprobs import LAYOUTS, keeps_logits, response_logprobs
from tests.helpers import reference_logprobs, tiny_model

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15]]  # two rows share a prompt
RESPONSES = [[20, 21], [22], [23, 24, 25, 1]]


def batch_of(prompts, responses) -> Batch:
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    response_ids, response_mask = right_pad(responses, 0, width=6)  # 2 columns of padding in every row
    return Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "loss_mask": response_mask,
        }
    )


def projected_rows(model, layout: str) -> list[int]:
    """How many positions each forward sent through the output projection (the LM head)."""
    rows: list[int] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda m, i, o: rows.append(i[0].numel() // i[0].shape[-1])
    )
    try:
        response_logprobs(model, batch_of(PROMPTS, RESPONSES), 1.0, layout)
    finally:
        hook.remove()
    return rows


@pytest.fixture(scope="module")
def model():
    return tiny_model(hidden=32, layers=2, intermediate=64)[0]


def test_only_the_positions_read_are_projected(model):
    assert keeps_logits(model)
    # packed: one row of all 8 + 8 + 3 + 7 tokens, of which only the 2 + 1 + 4 response tokens' predictors
    assert projected_rows(model, "packed") == [7]
    # padded: 3 rows trimmed to 4 response columns, projected from column P - 1 on (4 + 1 positions a row)
    assert projected_rows(model, "padded") == [3 * 5]
    # shared_prompt: each of the 2 distinct prompts' last position, then the 3 rows' 4 response positions
    assert projected_rows(model, "shared_prompt") == [2, 3 * 4]


class WithoutKeep(torch.nn.Module):
    """A causal LM whose forward has no `logits_to_keep` (remote code, older transformers)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None, **rest):
        assert "logits_to_keep" not in rest
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache, **rest
        )


@pytest.mark.parametrize("layout", [layout for layout in LAYOUTS if layout != "shared_prompt"])
def test_a_model_without_logits_to_keep_gets_the_same_logprobs(model, layout):
    plain = WithoutKeep(model)
    assert not keeps_logits(plain)
    batch = batch_of(PROMPTS, RESPONSES)
    with torch.no_grad():
        got, entropy = response_logprobs(plain, batch, 0.7, layout, with_entropy=True)
        want, want_entropy = response_logprobs(model, batch, 0.7, layout, with_entropy=True)
        torch.testing.assert_close(got, reference_logprobs(model, batch, 0.7), rtol=0, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, want_entropy, rtol=0, atol=1e-5)
    assert (entropy[batch["response_mask"]] > 0).all() and (entropy[~batch["response_mask"]] == 0).all()
