import torch

from rlpost.data.batch import Batch
from rlpost.data.padding import (
    concat_generations,
    left_pad,
    model_inputs,
    response_logits,
    response_mask_from_eos,
    right_pad,
    token_logprobs,
)


def test_left_and_right_pad():
    ids, mask = left_pad([[1, 2], [3]], pad_id=0)
    assert ids.tolist() == [[1, 2], [0, 3]] and mask.tolist() == [[True, True], [False, True]]
    vals, mask = right_pad([[1.5], []], pad=0.0, width=2, dtype=torch.float32)
    assert vals.tolist() == [[1.5, 0.0], [0.0, 0.0]] and mask.tolist() == [[True, False], [False, False]]


def test_response_mask_includes_first_eos_only():
    ids = torch.tensor([[5, 6, 1, 0, 0], [5, 1, 5, 1, 0], [5, 5, 5, 5, 5]])
    assert response_mask_from_eos(ids, eos_id=1).long().tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_model_inputs_positions_skip_padding():
    b = Batch(
        {
            "prompt_ids": torch.tensor([[0, 7, 8], [7, 8, 9]]),
            "prompt_mask": torch.tensor([[False, True, True], [True, True, True]]),
            "response_ids": torch.tensor([[4, 1], [4, 0]]),
            "response_mask": torch.tensor([[True, True], [True, False]]),
        }
    )
    ids, attn, pos = model_inputs(b)
    assert ids.tolist() == [[0, 7, 8, 4, 1], [7, 8, 9, 4, 0]]
    assert attn.tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert pos[0, 1:].tolist() == [0, 1, 2, 3] and pos[1, :4].tolist() == [0, 1, 2, 3]


def test_shift_by_one():
    # logits at column c "predict" token c+1: put a spike on the right token per column
    P, R, V = 3, 2, 6
    resp = torch.tensor([[2, 5]])
    logits = torch.full((1, P + R, V), -30.0)
    logits[0, P - 1, 2] = 0.0  # predicts response token 0
    logits[0, P, 5] = 0.0  # predicts response token 1
    lp = token_logprobs(response_logits(logits, P), resp)
    assert torch.allclose(lp, torch.zeros(1, 2), atol=1e-6)


def test_concat_generations_repads():
    a = Batch(
        {
            "prompt_ids": torch.tensor([[7]]),
            "prompt_mask": torch.tensor([[True]]),
            "response_ids": torch.tensor([[4, 1]]),
            "response_mask": torch.tensor([[True, True]]),
            "rollout_logprobs": torch.tensor([[-0.5, -0.25]]),
            "weight_version": torch.tensor([3]),
        }
    )
    b = Batch(
        {
            "prompt_ids": torch.tensor([[7, 8]]),
            "prompt_mask": torch.tensor([[True, True]]),
            "response_ids": torch.tensor([[4]]),
            "response_mask": torch.tensor([[True]]),
            "rollout_logprobs": torch.tensor([[-1.0]]),
            "weight_version": torch.tensor([3]),
        }
    )
    c = concat_generations([a, b], pad_id=0)
    assert c["prompt_ids"].tolist() == [[0, 7], [7, 8]]
    assert c["prompt_mask"].tolist() == [[False, True], [True, True]]
    assert c["response_ids"].tolist() == [[4, 1], [4, 0]]
    assert c["rollout_logprobs"].tolist() == [[-0.5, -0.25], [-1.0, 0.0]]
    assert c["weight_version"].tolist() == [3, 3]
