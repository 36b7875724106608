"""On a GPU: the streamed LayerwiseAdamW (3 CUDA streams, pinned host states) equals torch's
AdamW after 10 steps, float32 within 1e-6 relative and bfloat16 within one ulp."""

import pytest
import torch

from rlpost.trainer.optim import LayerwiseAdamW

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_streamed_step_matches_torch_adamw(dtype, prefetch):
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [[(256, 128), (128,)], [(512, 256)], [(64, 64), (64,), (33,)], [(1000,)]]
    ours = [[torch.nn.Parameter(torch.randn(s, device="cuda", generator=g).to(dtype)) for s in unit] for unit in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for unit in ours for p in unit]
    hyper = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = LayerwiseAdamW(ours, prefetch_layers=prefetch, **hyper)
    assert all(h.is_pinned() for h in opt.host)
    torch_opt = torch.optim.AdamW(ref, foreach=False, **hyper)
    flat = [p for unit in ours for p in unit]
    for _ in range(10):
        for p, r in zip(flat, ref):
            grad = torch.randn(p.shape, device="cuda", generator=g).to(dtype)
            p.grad, r.grad = grad.clone(), grad.clone()
        opt.step()
        torch_opt.step()
    for p, r in zip(flat, ref):
        if dtype == torch.float32:
            assert ((p - r).abs().max() / r.abs().max()).item() <= 1e-6
        else:
            ulp = torch.finfo(dtype).eps * r.float().abs()
            assert torch.all((p.float() - r.float()).abs() <= ulp)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("weight_decay, dtype", [(0.0, torch.float32), (0.1, torch.float32), (0.1, torch.bfloat16)])
def test_fsdp2_nccl_matches_torch_adamw(tmp_path, world, weight_decay, dtype):
    """The CPU test's FSDP2 comparison, on GPUs over NCCL (10 steps, clipping on)."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    from tests.optim_reference import check_against_torch

    check_against_torch(tmp_path, world, weight_decay, dtype, device_type="cuda")
