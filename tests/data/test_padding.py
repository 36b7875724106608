import re

import pytest
import torch

from rlpost.data.batch import Batch
from rlpost.data.padding import (
    check_masks,
    concat_generations,
    left_pad,
    model_inputs,
    pack,
    pack_tokens,
    response_logits,
    response_mask_from_eos,
    right_pad,
    token_logprobs,
    trim_padding,
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


def test_concat_generations_pads_ids_with_pad_id_and_the_rest_with_zero():
    """pad_id 9: the narrower prompt gets 9 on the left of its ids, False on its mask; the narrower
    response gets 9 on the right of its ids, zeros on every other per-token tensor; [B] tensors and
    dtypes stay as they were."""
    a = Batch(
        {
            "prompt_ids": torch.tensor([[7]]),
            "prompt_mask": torch.tensor([[True]]),
            "response_ids": torch.tensor([[4, 1]]),
            "response_mask": torch.tensor([[True, True]]),
            "loss_mask": torch.tensor([[True, False]]),
            "rollout_logprobs": torch.tensor([[-0.5, -0.25]]),
            "weight_version": torch.tensor([3]),
        }
    )
    b = Batch(
        {
            "prompt_ids": torch.tensor([[7, 8], [6, 5]]),
            "prompt_mask": torch.tensor([[True, True], [True, True]]),
            "response_ids": torch.tensor([[4], [2]]),
            "response_mask": torch.tensor([[True], [True]]),
            "loss_mask": torch.tensor([[True], [True]]),
            "rollout_logprobs": torch.tensor([[-1.0], [-2.0]]),
            "weight_version": torch.tensor([4, 5]),
        }
    )
    c = concat_generations([a, b], pad_id=9)
    assert c["prompt_ids"].tolist() == [[9, 7], [7, 8], [6, 5]]
    assert c["prompt_mask"].tolist() == [[False, True], [True, True], [True, True]]
    assert c["response_ids"].tolist() == [[4, 1], [4, 9], [2, 9]]
    assert c["response_mask"].tolist() == [[True, True], [True, False], [True, False]]
    assert c["loss_mask"].tolist() == [[True, False], [True, False], [True, False]]
    assert c["rollout_logprobs"].tolist() == [[-0.5, -0.25], [-1.0, 0.0], [-2.0, 0.0]]
    assert c["weight_version"].tolist() == [3, 4, 5]
    for k, v in c.tensors.items():
        assert v.dtype == a[k].dtype, k


def test_check_masks_names_what_is_wrong():
    """A response mask with a hole, and a loss mask outside the response mask (first bad row named)."""
    response = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    ok = torch.tensor([[True, False, False], [False, False, False], [False, True, True]])
    check_masks(Batch({"response_mask": response, "loss_mask": ok}))
    holed = response.clone()
    holed[2, 1] = False
    prefix = "response_mask must mark a prefix of each row (responses are right-padded)"
    with pytest.raises(ValueError, match="^" + re.escape(prefix) + "$"):
        check_masks(Batch({"response_mask": holed, "loss_mask": ok}))
    outside = ok.clone()
    outside[1, 2] = True  # row 1 only
    with pytest.raises(ValueError, match=r"^row 1: loss_mask marks tokens outside response_mask$"):
        check_masks(Batch({"response_mask": response, "loss_mask": outside}))
    outside[0, 2] = True  # rows 0 and 1: the first is named
    with pytest.raises(ValueError, match=r"^row 0: loss_mask marks tokens outside response_mask$"):
        check_masks(Batch({"response_mask": response, "loss_mask": outside}))


def packed_example():
    """Prompt lengths 2 and 1, response lengths 2 and 1: packed as [p p r r | p r], T = 6."""
    return pack(
        Batch(
            {
                "prompt_ids": torch.tensor([[5, 6], [0, 7]]),
                "prompt_mask": torch.tensor([[True, True], [False, True]]),
                "response_ids": torch.tensor([[3, 4], [8, 0]]),
                "response_mask": torch.tensor([[True, True], [True, False]]),
            }
        )
    )


def test_pack_tokens_places_values_and_keeps_their_dtype():
    """Response values land at their packed positions, 0 on prompt tokens; long and float64 values
    keep their dtype (not the default float32)."""
    p = packed_example()
    for dtype in (torch.long, torch.float64):
        out = pack_tokens(torch.tensor([[10, 20], [30, 99]], dtype=dtype), p)
        assert out.dtype == dtype
        assert out.tolist() == [0, 0, 10, 20, 0, 30]


def test_pack_tokens_output_follows_the_values_not_the_default_device():
    """The packed tensor is made on the values' device, whatever the default device is (on a GPU:
    CUDA values with a CPU default; here: CPU values with the meta device as the default)."""
    p = packed_example()
    values = torch.tensor([[1.5, 2.5], [3.5, 0.0]])
    with torch.device("meta"):
        out = pack_tokens(values, p)
    assert out.device == values.device
    assert out.tolist() == [0.0, 0.0, 1.5, 2.5, 0.0, 3.5]


def test_trim_padding_keeps_the_longest_rows_columns():
    """Prompt columns padding in every row go from the left, response columns from the right;
    every per-token tensor is cut alike, [B] tensors are kept."""
    b = Batch(
        {
            "prompt_ids": torch.tensor([[0, 0, 5], [0, 6, 7]]),
            "prompt_mask": torch.tensor([[False, False, True], [False, True, True]]),
            "response_ids": torch.tensor([[3, 4, 0, 0], [8, 0, 0, 0]]),
            "response_mask": torch.tensor([[True, True, False, False], [True, False, False, False]]),
            "loss_mask": torch.tensor([[False, True, False, False], [True, False, False, False]]),
            "rollout_logprobs": torch.tensor([[-1.0, -2.0, 0.0, 0.0], [-3.0, 0.0, 0.0, 0.0]]),
            "weight_version": torch.tensor([1, 2]),
        }
    )
    t = trim_padding(b)
    assert t["prompt_ids"].tolist() == [[0, 5], [6, 7]]
    assert t["prompt_mask"].tolist() == [[False, True], [True, True]]
    assert t["response_ids"].tolist() == [[3, 4], [8, 0]]
    assert t["response_mask"].tolist() == [[True, True], [True, False]]
    assert t["loss_mask"].tolist() == [[False, True], [True, False]]
    assert t["rollout_logprobs"].tolist() == [[-1.0, -2.0], [-3.0, 0.0]]
    assert t["weight_version"].tolist() == [1, 2]


def test_trim_padding_of_an_empty_batch_has_no_columns():
    """Zero rows: nothing to keep, every [0, W] tensor becomes [0, 0] (and no max of nothing is taken)."""
    b = Batch(
        {
            "prompt_ids": torch.zeros(0, 3, dtype=torch.long),
            "prompt_mask": torch.zeros(0, 3, dtype=torch.bool),
            "response_ids": torch.zeros(0, 4, dtype=torch.long),
            "response_mask": torch.zeros(0, 4, dtype=torch.bool),
            "weight_version": torch.zeros(0, dtype=torch.long),
        }
    )
    t = trim_padding(b)
    assert {k: tuple(v.shape) for k, v in t.tensors.items()} == {
        "prompt_ids": (0, 0),
        "prompt_mask": (0, 0),
        "response_ids": (0, 0),
        "response_mask": (0, 0),
        "weight_version": (0,),
    }


def test_pack_refuses_an_empty_prompt_or_a_response_mask_with_holes_naming_the_row():
    prompt_ids, prompt_mask = left_pad([[5, 6], [7], [8, 9]], 0)
    prompt_mask[2] = False  # row 2's prompt is all padding
    response_ids, response_mask = right_pad([[1, 2], [3], [4]], 0)
    batch = Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
        }
    )
    with pytest.raises(ValueError, match="^row 2 has an empty prompt$"):
        pack(batch)
    batch["prompt_mask"][2] = True
    batch["response_mask"][0] = torch.tensor([False, True])
    with pytest.raises(
        ValueError, match=r"^response_mask must mark a prefix of each row \(responses are right-padded\)$"
    ):
        pack(batch)


def test_pack_cu_seqlens_are_int32_offsets():
    prompt_ids, prompt_mask = left_pad([[5, 6], [7]], 0)
    response_ids, response_mask = right_pad([[1, 2, 3], [4]], 0)
    p = pack(
        Batch(
            {
                "prompt_ids": prompt_ids,
                "prompt_mask": prompt_mask,
                "response_ids": response_ids,
                "response_mask": response_mask,
            }
        )
    )
    assert p.cu_seqlens.dtype == torch.int32 and p.cu_seqlens.tolist() == [0, 5, 7] and p.max_seqlen == 5
