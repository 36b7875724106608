"""The layerwise optimizer against torch's AdamW under FSDP2, in ranks of their own (CPU tests
and the GPU test share it)."""

import torch

from rlpost.weightsync.transport import free_port
from tests.helpers import run_ranks, small_model


def adamw_steps(rank, world, port, kind, weight_decay, dtype, out, device_type="cpu"):
    """10 steps of LayerwiseAdamW (`kind="layerwise"`) or torch's AdamW under FSDP2 on this rank."""
    import os

    import torch.distributed as dist

    from rlpost.trainer.optim import LayerwiseAdamW

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cuda = device_type == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        from rlpost.trainer.fsdp import fsdp_units, full_tensor, shard_model

        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        model = shard_model(small_model(dtype), device, dtype)
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
        dist.barrier()  # no rank tears gloo down while a peer still talks to it
    finally:
        dist.destroy_process_group()


def adamw_run(tmp_path, world, kind, weight_decay, dtype, device_type="cpu"):
    out = tmp_path / f"{kind}-{world}-{weight_decay}-{dtype}.pt"
    run_ranks(adamw_steps, world, free_port(), kind, weight_decay, dtype, str(out), device_type)
    return torch.load(out)


def check_against_torch(tmp_path, world, weight_decay, dtype, device_type="cpu"):
    """LayerwiseAdamW equals torch's AdamW after 10 steps under FSDP2 (fp32 1e-6, bf16 one ulp)."""
    ours = adamw_run(tmp_path, world, "layerwise", weight_decay, dtype, device_type)
    ref = adamw_run(tmp_path, world, "torch", weight_decay, dtype, device_type)
    start = small_model(dtype).state_dict()
    for name, r in ref.items():
        assert not torch.equal(r, start[name]), f"{name} never moved: the test would prove nothing"
        if dtype == torch.float32:
            rel = ((ours[name] - r).abs().max() / r.abs().max().clamp(min=1e-12)).item()
            assert rel <= 1e-6, f"{name}: relative difference {rel:.2e}"
        else:  # within one ulp of the reference
            ulp = torch.finfo(dtype).eps * r.float().abs().clamp(min=2**-126)
            assert torch.all((ours[name].float() - r.float()).abs() <= ulp), name
