"""LayerwiseAdamW is torch's AdamW: 10 steps under FSDP2 (world size 1 and 2), with gradient
clipping, weight decay on and off, against torch.optim.AdamW on the same model. On the CPU
(gloo) here; tests/gpu/test_layerwise_optim_gpu.py runs the same on CUDA (NCCL, streams)."""

import pytest
import torch

from rlpost.trainer.optim import LayerwiseAdamW
from tests.helpers import WORLDS, check_against_torch, small_model


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_matches_torch_adamw_float32(tmp_path, world, weight_decay):
    check_against_torch(tmp_path, world, weight_decay, torch.float32)


@pytest.mark.parametrize("world", WORLDS)
def test_matches_torch_adamw_bfloat16_within_one_ulp(tmp_path, world):
    check_against_torch(tmp_path, world, 0.1, torch.bfloat16)


def test_state_dict_round_trip_keeps_pinned_buffers():
    model = small_model(torch.float32)
    units = [list(layer.parameters()) for layer in model.model.layers]
    units.append([p for p in model.parameters() if all(p is not q for u in units for q in u)])
    opt = LayerwiseAdamW(units, lr=1e-2)
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    saved = opt.state_dict()
    other = LayerwiseAdamW(units, lr=1e-2)
    buffers = [h.data_ptr() for h in other.host]
    other.load_state_dict(saved)
    assert other.steps == 1 and [h.data_ptr() for h in other.host] == buffers
    assert all(torch.equal(a, b) for a, b in zip(other.host, opt.host))
    with pytest.raises(ValueError, match="different model"):
        LayerwiseAdamW(units[:1], lr=1e-2).load_state_dict(saved)
