"""LayerwiseAdamW is torch's AdamW: 10 steps under FSDP2 (world size 1 and 2), with gradient
clipping, weight decay on and off, against torch.optim.AdamW on the same model. On the CPU
(gloo) here; tests/gpu/test_layerwise_optim_gpu.py runs the same on CUDA (NCCL, streams)."""

import pytest
import torch

from rlpost.trainer.optim import LayerwiseAdamW
from tests.helpers import WORLDS, small_model
from tests.optim_reference import check_against_torch


@pytest.mark.parametrize(
    "world, weight_decay",
    # two ranks without weight decay left to -m demo for CI's time: the sharded path is the same with it
    [(1, 0.0), (1, 0.1), pytest.param(2, 0.0, marks=[pytest.mark.multiprocess, pytest.mark.demo])]
    + [pytest.param(2, 0.1, marks=pytest.mark.multiprocess)],
)
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


def units_of(model):
    units = [list(layer.parameters()) for layer in model.model.layers]
    units.append([p for p in model.parameters() if all(p is not q for u in units for q in u)])
    return units


def test_defaults_are_torch_adamw_defaults_and_one_unit_is_prefetched():
    model = small_model(torch.float32)
    ours, torchs = LayerwiseAdamW(units_of(model)), torch.optim.AdamW(model.parameters())
    for key in ("lr", "betas", "eps", "weight_decay"):
        assert ours.defaults[key] == torchs.defaults[key], key
    assert ours.prefetch == 1 and ours.slot_count == 2


@pytest.mark.parametrize(("prefetch", "slots"), [(-3, 1), (0, 1), (1, 2), (2, 3), (10, 4)])
def test_device_slots_follow_prefetch_layers(prefetch, slots):
    """`prefetch_layers + 1` units' states on the device at most (never more than there are
    units, never fewer than one), each slot the size of the largest unit's two moments."""
    units = units_of(small_model(torch.float32))
    assert len(units) == 4
    opt = LayerwiseAdamW(units, prefetch_layers=prefetch)
    assert opt.prefetch == max(0, prefetch) and opt.slot_count == slots
    largest = max(sum(p.numel() for p in unit) for unit in units)
    made = opt._slots(opt.slot_count)
    assert len(made) == slots and all(s.numel() == 2 * largest and s.dtype == torch.float32 for s in made)


def test_between_steps_the_optimizer_keeps_only_its_host_states():
    """The device slots live for one step: between steps (while a colocated rollout engine is
    awake, and through the forward and backward) the optimizer holds no tensor but the host
    states. At 7B two slots kept for the run were 17 GB of the GPU."""
    model = small_model(torch.float32)
    opt = LayerwiseAdamW(units_of(model), lr=1e-2)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    held = [v for v in vars(opt).values() if isinstance(v, torch.Tensor)]
    held += [t for v in vars(opt).values() if isinstance(v, list) for t in v if isinstance(t, torch.Tensor)]
    assert sorted(t.data_ptr() for t in held) == sorted(h.data_ptr() for h in opt.host)
    assert sum(t.numel() for t in held) == 2 * sum(p.numel() for p in model.parameters())


def test_states_take_the_parameters_dtype_and_a_single_parameter_works():
    p = torch.nn.Parameter(torch.ones(5, dtype=torch.bfloat16))
    opt = LayerwiseAdamW([[p]], lr=0.1, weight_decay=0.0)
    assert opt.host[0].dtype == torch.bfloat16 and opt.host[0].numel() == 10
    assert opt._slots(1)[0].dtype == torch.bfloat16 and opt.device == p.device
    p.grad = torch.full_like(p, 2.0)
    opt.step()
    reference = torch.nn.Parameter(torch.ones(5, dtype=torch.bfloat16))
    reference.grad = torch.full_like(reference, 2.0)
    torch.optim.AdamW([reference], lr=0.1, weight_decay=0.0, foreach=False).step()
    assert torch.equal(p.detach(), reference.detach())


def test_refusals_name_the_problem():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="^a parameter appears in two units$"):
        LayerwiseAdamW([[a], [a]])
    with pytest.raises(
        ValueError, match=r"^LayerwiseAdamW needs one parameter dtype; found \['torch.bfloat16', 'torch.float32'\]$"
    ):
        LayerwiseAdamW([[a], [b]])
    with pytest.raises(ValueError, match="^LayerwiseAdamW does not take a closure$"):
        LayerwiseAdamW([[a]]).step(lambda: 0.0)


@pytest.mark.parametrize("old, new", [(2, 1), (1, 3), (3, 2), (4, 4)])
def test_layerwise_states_reshard_as_fsdp_shards_rows(old, new):
    """Host states saved by `old` ranks, cut for `new` ranks, equal the moments split the way
    FSDP2 splits rows (torch.chunk) for `new` ranks: nothing lost, nothing moved."""
    from rlpost.trainer.optim import reshard_host_states

    torch.manual_seed(0)
    shapes = [[torch.Size([5, 3]), torch.Size([2]), torch.Size([7, 2, 2])], [torch.Size([1, 4])]]
    full = [[(torch.randn(s), torch.randn(s)) for s in unit] for unit in shapes]  # (exp_avg, exp_avg_sq)

    def host(rank, world):  # what LayerwiseAdamW holds on `rank`: [exp_avg of each | exp_avg_sq of each]
        def local(t):
            parts = list(torch.chunk(t, world, dim=0))
            return parts[rank].reshape(-1) if rank < len(parts) else t.new_empty(0)

        return [torch.cat([local(m[0]) for m in unit] + [local(m[1]) for m in unit]) for unit in full]

    saved = [host(r, old) for r in range(old)]
    for rank in range(new):
        got = reshard_host_states(saved, shapes, rank, new)
        want = host(rank, new)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), (old, new, rank)
