"""On 2+ GPUs: a tensor-parallel vLLM engine (2 shards, one per GPU) synced as colocated runs sync
it, each shard by CUDA IPC from the sender on its own GPU: every shard's slices are read back and
checked (on a GPU nothing is repacked, so all of them), generation follows the new weights, and a
shard paired with the sender of another GPU is refused by name before any memory is mapped. (Split
placement, NCCL from a sender on a GPU of its own, needs 3 GPUs: `benchmarks/gpu_session.sh W`.)"""

import threading

import pytest
import torch

from rlpost.weightsync.transport import free_port

pytestmark = pytest.mark.gpu
pytest.importorskip("vllm")

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from rlpost.rollout.vllm_engine import VLLMRolloutEngine
    from tests.helpers import save_tiny_model

    if GPUS < 2:
        pytest.skip("needs 2 GPUs")
    folder = tmp_path_factory.mktemp("tp-gpu")
    model, tok = save_tiny_model(folder, family="llama", tied=True)  # SmolLM2's kind: a head tied by parameter
    e = VLLMRolloutEngine(
        str(folder), "bfloat16", "cuda", tok.pad_token_id, tok.eos_token_id, seed=0, max_model_len=64,
        gpu_memory_utilization=0.2, enforce_eager=True, max_num_seqs=16, sleep_mode=True, tensor_parallel_size=2,
    )  # fmt: skip
    yield e, model.to(torch.bfloat16), tok
    e.close()


def senders(ports, devices, transport):
    """One sender group per port (rank 0 on `devices[i]`), made in threads while the shards join."""
    from rlpost.weightsync.transport import SyncGroup

    groups = [None] * len(ports)

    def make(i):
        torch.cuda.set_device(devices[i])
        groups[i] = SyncGroup("127.0.0.1", ports[i], 0, 2 if transport == "ipc" else 3, devices[i], 60, transport)

    threads = [threading.Thread(target=make, args=(i,), daemon=True) for i in range(len(ports))]
    for t in threads:
        t.start()
    return groups, threads


def push(groups, named, version):
    from rlpost.weightsync.manifest import manifest_of
    from rlpost.weightsync.sync import send_weights

    errors = []

    def send(group):
        try:
            torch.cuda.set_device(group.device)  # a thread starts on GPU 0; a trainer rank's process is on its own
            tensors = iter([t.to(group.device) for _, t in named])
            send_weights(group, manifest_of(named), tensors, version, 1 << 20)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=send, args=(g,), daemon=True) for g in groups]
    for t in threads:
        t.start()
    return threads, errors


def test_colocated_shards_are_synced_by_ipc_on_their_own_gpus(engine):
    from rlpost.rollout.base import SamplingParams
    from tests.helpers import PROMPTS, reference_logprobs

    e, model, tok = engine
    ports = [free_port(), free_port()]
    groups, threads = senders(ports, ["cuda:0", "cuda:1"], "ipc")
    e.join_sync([("127.0.0.1", ports[0], 1, 2), ("127.0.0.1", ports[1], 1, 2)], "cuda", 60, "ipc")
    for t in threads:
        t.join()
    torch.manual_seed(1)
    new = {
        n: (p.detach().float() + 0.05 * torch.randn_like(p.float())).to(p.dtype) for n, p in model.named_parameters()
    }
    e.sleep()  # as between a colocated run's phases
    sending, errors = push(groups, list(new.items()), 1)
    try:
        stats = e.receive_sharded(1)
    finally:
        for t in sending:
            t.join(timeout=120)
        assert not errors, errors  # a sender's failure is the cause of a receiver's timeout
    assert stats.readback == len(new)  # every slice of every shard read back and checked
    model.load_state_dict(new, strict=False)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    batch = e.generate(prompts, SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=3))
    diff = (reference_logprobs(model.float(), batch, 1.0) - batch["rollout_logprobs"]).abs()[batch["response_mask"]]
    assert diff.mean().item() < 0.05, diff.mean()  # bf16 on two shards against a float32 reference


def test_a_shard_paired_with_another_gpus_sender_is_refused(engine):
    from rlpost.weightsync.manifest import WeightSyncError

    e, _, _ = engine
    ports = [free_port(), free_port()]
    groups, threads = senders(ports, ["cuda:1", "cuda:0"], "ipc")  # crossed: shard 0 is on GPU 0
    with pytest.raises(WeightSyncError, match="colocated ranks must share one GPU"):
        e.join_sync([("127.0.0.1", ports[0], 1, 2), ("127.0.0.1", ports[1], 1, 2)], "cuda", 60, "ipc")
    for t in threads:
        t.join(timeout=60)
