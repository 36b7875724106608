"""LayerwiseAdamW is torch's AdamW: 10 steps under FSDP2 (world size 1 and 2), with gradient
clipping, weight decay on and off, against torch.optim.AdamW on the same model. On the CPU
(gloo) here; tests/gpu/test_layerwise_optim_gpu.py runs the same on CUDA (NCCL, streams)."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlpost.trainer.optim import LayerwiseAdamW
from rlpost.weightsync.transport import free_port


def tiny_model(dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg).to(dtype)


def train(rank, world, port, kind, weight_decay, dtype, out, device_type="cpu"):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cuda = device_type == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        from rlpost.trainer.fsdp import fsdp_units, full_tensor, shard_model

        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        model = shard_model(tiny_model(dtype), device, dtype)
        hyper = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
        if kind == "layerwise":
            opt = LayerwiseAdamW(fsdp_units(model), prefetch_layers=1, **hyper)
        else:
            opt = torch.optim.AdamW(model.parameters(), foreach=False, **hyper)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(10):
            ids = torch.randint(0, 64, (4, 12), generator=g).to(device)
            model(input_ids=ids, labels=ids).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # clipping is active
            opt.step()
            opt.zero_grad(set_to_none=True)
        state = {n: full_tensor(p.detach()).cpu().clone() for n, p in model.named_parameters()}
        if rank == 0:
            torch.save(state, out)
        dist.barrier()  # no rank tears gloo down while a peer still talks to it (SIGABRT seen in CI)
    finally:
        dist.destroy_process_group()


def run(tmp_path, world, kind, weight_decay, dtype, device_type="cpu"):
    out = tmp_path / f"{kind}-{world}-{weight_decay}-{dtype}.pt"
    mp.spawn(train, args=(world, free_port(), kind, weight_decay, dtype, str(out), device_type),
             nprocs=world, join=True)
    return torch.load(out)


def check_against_torch(tmp_path, world, weight_decay, dtype, device_type="cpu"):
    ours = run(tmp_path, world, "layerwise", weight_decay, dtype, device_type)
    ref = run(tmp_path, world, "torch", weight_decay, dtype, device_type)
    start = tiny_model(dtype).state_dict()
    for name, r in ref.items():
        assert not torch.equal(r, start[name]), f"{name} never moved: the test would prove nothing"
        if dtype == torch.float32:
            rel = ((ours[name] - r).abs().max() / r.abs().max().clamp(min=1e-12)).item()
            assert rel <= 1e-6, f"{name}: relative difference {rel:.2e}"
        else:  # within one ulp of the reference
            ulp = torch.finfo(dtype).eps * r.float().abs().clamp(min=2**-126)
            assert torch.all((ours[name].float() - r.float()).abs() <= ulp), name


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_matches_torch_adamw_float32(tmp_path, world, weight_decay):
    check_against_torch(tmp_path, world, weight_decay, torch.float32)


@pytest.mark.parametrize("world", [1, 2])
def test_matches_torch_adamw_bfloat16_within_one_ulp(tmp_path, world):
    check_against_torch(tmp_path, world, 0.1, torch.bfloat16)


def test_state_dict_round_trip_keeps_pinned_buffers():
    model = tiny_model(torch.float32)
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
