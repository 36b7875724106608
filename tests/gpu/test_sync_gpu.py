"""On GPUs: weight sync by CUDA IPC between two processes on one GPU (colocate), and a trainer
with `trainer.param_offload=true` pushing its weights: the rollout gets exactly the trainer's
values and every parameter is back where it was afterwards."""

import pytest
import torch
import torch.multiprocessing as mp

from rlpost.weightsync.transport import free_port

pytestmark = pytest.mark.gpu


def _ipc_pair(rank, port, out):
    from rlpost.weightsync.manifest import manifest_of
    from rlpost.weightsync.sync import receive_weights, send_weights
    from rlpost.weightsync.transport import SyncGroup

    torch.cuda.set_device(0)
    g = torch.Generator(device="cuda").manual_seed(0)
    named = [
        (f"t{i}", torch.randn(1000 + 37 * i, 64, device="cuda", generator=g).to(torch.bfloat16)) for i in range(12)
    ]
    group = SyncGroup("127.0.0.1", port, rank, 2, "cuda:0", 60, "ipc")
    if rank == 0:
        for version in (1, 2):  # twice: the sender reuses freed bucket memory for the second round
            send_weights(group, manifest_of(named), iter([t * version for _, t in named]), version, 2**20)
        return
    params = {n: torch.zeros_like(t) for n, t in named}
    kept = []

    def load(tensors):
        for name, t in tensors:
            kept.append(t)  # an engine may keep the tensors it got (vLLM buffers whole layers)
            params[name].copy_(t)

    for version in (1, 2):
        kept.clear()
        stats = receive_weights(group, manifest_of(named), version, load, params.get)
        assert stats.readback == len(named)
    for (name, t), k in zip(named, kept):
        assert torch.equal(params[name], t * 2) and torch.equal(k, t * 2), name
    out.put("ok")


def test_ipc_transport_between_two_processes_on_one_gpu():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(_ipc_pair, args=(free_port(), out), nprocs=2, start_method="spawn")
    assert out.get(timeout=5) == "ok"


def _offload_pair(rank, model_dir, ports, keep, out):
    from rlpost.config import load_config
    from rlpost.trainer.fsdp import full_tensor
    from rlpost.weightsync.checksums import checksum

    torch.cuda.set_device(0)
    cfg = load_config(
        [
            "+recipe=quickstart",
            "trainer.device=cuda",
            "trainer.world_size=1",
            "trainer.param_offload=true",
            "algo.kl_coef=0",
        ]
    )
    if rank == 0:
        from rlpost.roles.actor import ActorWorker

        trainer = ActorWorker(cfg, model_dir, 0, 1, "127.0.0.1", ports[0])
        assert {p.device.type for p in trainer.model.parameters()} == {"cpu"}  # offloaded between phases
        with torch.no_grad():
            for p in trainer.model.parameters():
                p.add_(0.01)  # weights the rollout does not have yet
        trainer.init_weight_sync("127.0.0.1", ports[1], 2, "ipc")
        trainer.push_weights(1, keep_on_gpu=keep)
        where = {p.device.type for p in trainer.model.parameters()}
        assert where == ({"cuda"} if keep else {"cpu"}), where
        # checksums, not tensors: tensors put on a queue vanish with the process that shared them
        out.put(
            (
                "trainer",
                {n: checksum(full_tensor(p.detach()).to(torch.float32)) for n, p in trainer.model.named_parameters()},
            )
        )
        trainer.shutdown()
    else:
        from rlpost.rollout.worker import RolloutWorker

        rollout = RolloutWorker(cfg, model_dir, 0, 0, 1)
        rollout.init_weight_sync([("127.0.0.1", ports[1], 1, 2)], "ipc")
        stats = rollout.receive_weights(1)
        assert stats.readback > 0
        out.put(("rollout", {n: checksum(p.detach().to(torch.float32)) for n, p in rollout.engine.params.items()}))


@pytest.mark.parametrize("keep", [False, True])
def test_param_offload_sync_restores_devices(tmp_path, keep):
    from tests.helpers import save_tiny_model

    save_tiny_model(tmp_path)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(
        _offload_pair, args=(str(tmp_path), (free_port(), free_port()), keep, out), nprocs=2, start_method="spawn"
    )
    got = dict([out.get(timeout=5), out.get(timeout=5)])
    trainer, rollout = got["trainer"], got["rollout"]
    assert trainer.keys() == rollout.keys()
    for name in trainer:
        assert trainer[name] == rollout[name], name


def test_checksums_are_equal_on_cpu_and_cuda():
    """The sender's and the receiver's checksums meet from different devices (a CPU-offloaded
    adapter, CUDA buckets): integer sums must agree bit for bit, in every code path."""
    from rlpost.weightsync.checksums import bucket_checksums, checksums
    from rlpost.weightsync.packing import pack

    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(n, generator=g).to(dtype)
        for n, dtype in [(4096, torch.bfloat16), (33, torch.bfloat16), (5 << 20, torch.float32), (160, torch.float16)]
    ]
    on_gpu = [t.cuda() for t in tensors]
    assert checksums(tensors) == checksums(on_gpu)
    flat = pack([tensors[0], tensors[0][:48]], torch.device("cpu"))
    assert bucket_checksums(flat, [4096, 48]).tolist() == bucket_checksums(flat.cuda(), [4096, 48]).tolist()
    parts = [torch.randn(n, generator=g).to(torch.bfloat16) for n in (3 << 20, 1000, 0, 70_001, 512)]
    flat = pack(parts, torch.device("cpu"))  # tensors of many rows (many programs each), partial rows
    numels = [t.numel() for t in parts]
    assert bucket_checksums(flat, numels).tolist() == bucket_checksums(flat.cuda(), numels).tolist()


def test_read_back_in_place_equals_cpu_checksums_call_after_call():
    """`ReadBack` on CUDA reads contiguous, aligned tensors in place (one Triton kernel) and stages
    the rest: its checksums equal the CPU's (no kernel there) for tensors with partial last rows,
    many rows, views into a fused tensor, misaligned and non-contiguous ones, with new values and
    new addresses at every call."""
    from rlpost.weightsync.checksums import ReadBack, checksums

    g = torch.Generator().manual_seed(3)

    def tensors():
        fused = torch.randn(3 * 896, 896, generator=g).to(torch.bfloat16).cuda()
        return [
            torch.randn(151936 * 8, generator=g).to(torch.bfloat16).cuda(),  # many programs
            fused[:896],
            fused[896:1792],  # views at offsets, as vLLM's fused qkv hands back
            torch.randn(904, generator=g).to(torch.bfloat16).cuda(),  # 1808 bytes: a partial row
            torch.randn(8, generator=g).cuda(),  # 32 bytes
            torch.randn(4000, generator=g).to(torch.bfloat16).cuda()[1:3073],  # misaligned: staged
            torch.randn(9, 64, generator=g).cuda().t(),  # not contiguous: staged
            torch.randn(7, generator=g).to(torch.bfloat16).cuda(),  # 14 bytes: staged
            torch.randint(-(2**31), 2**31 - 1, (2 << 20,), generator=g, dtype=torch.int32).cuda(),
            torch.zeros(0, device="cuda"),
        ]

    first = tensors()
    reader = ReadBack(first)
    assert reader.kernel is not None and reader.in_place == [0, 1, 2, 3, 4, 8, 9]
    for ts in (first, tensors(), tensors()):
        assert reader.matches(ts)
        assert reader(ts).tolist() == checksums([t.cpu() for t in ts])
    flipped = tensors()
    want = checksums([t.cpu() for t in flipped])
    flipped[3].view(torch.int16)[903] ^= 1  # the last element of a partial row
    got = reader(flipped).tolist()
    assert got[3] != want[3] and got[:3] == want[:3] and got[4:] == want[4:]
