"""A tensor-parallel vLLM engine on vLLM's CPU build (2 shards, each a worker process of vLLM's
multiprocessing executor): its generation matches the trainer's log-probs; a sync from a sender
thread reaches both shards, each keeps its slice, the slices are read back and checked, and the
next generation matches the trainer with the new weights; a shard that keeps a wrong slice fails
the sync on every rank, named. Slow: two worker processes start (about 30 s on 2 cores)."""

import gc
import threading

import pytest
import torch

pytest.importorskip("vllm")

from rlpost.rollout.base import SamplingParams  # noqa: E402
from rlpost.weightsync.manifest import WeightSyncError, manifest_of  # noqa: E402
from rlpost.weightsync.sync import send_weights  # noqa: E402
from rlpost.weightsync.transport import SyncGroup, free_port  # noqa: E402
from tests.helpers import PROMPTS, reference_logprobs, save_tiny_model, vllm_cpu_engine  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-tp")
    model, tok = save_tiny_model(folder, family="qwen2", tied=True)  # q/k/v biases: sharded and read back
    return str(folder), model, tok


@pytest.fixture(scope="module")
def engine(tiny):
    path, _, tok = tiny
    engine = vllm_cpu_engine(path, tok, gpu_memory_utilization=0.3, max_num_seqs=16, tensor_parallel_size=2)
    yield engine
    engine.close()  # the shards' processes end here, not at the interpreter's exit
    gc.collect()


def joined(engine) -> tuple[SyncGroup, int]:
    """A sender's group (this process, a thread) with the engine's two shards as ranks 1 and 2."""
    port, out = free_port(), {}
    thread = threading.Thread(target=lambda: out.update(group=SyncGroup("127.0.0.1", port, 0, 3, "cpu", 60)))
    thread.start()
    engine.join_sync([("127.0.0.1", port, 1, 3), ("127.0.0.1", port, 2, 3)], "cpu", 60, "broadcast")
    thread.join()
    return out["group"], port


def sync(engine, group, named, version, sent: dict, sender_version=None):
    """One sync from a sender thread into the engine's shards; the sender's stats or error in `sent`."""

    def sender():
        try:
            manifest, tensors = manifest_of(named), iter([t for _, t in named])
            sent["stats"] = send_weights(group, manifest, tensors, sender_version or version, 1 << 14)
        except Exception as e:  # noqa: BLE001
            sent["error"] = e

    thread = threading.Thread(target=sender)
    thread.start()
    try:
        return engine.receive_sharded(version)
    finally:
        thread.join(timeout=60)


def check_logprobs(engine, model, tok):
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    batch = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=3))
    diff = (reference_logprobs(model, batch, 1.0) - batch["rollout_logprobs"]).abs()[batch["response_mask"]]
    assert diff.max().item() < 1e-4, diff.max()


def test_two_shards_generate_receive_verify_and_generate_with_the_new_weights(tiny, engine):
    _, model, tok = tiny
    check_logprobs(engine, model, tok)
    group, _ = joined(engine)
    torch.manual_seed(1)
    new = {n: p.detach() + 0.2 * torch.randn_like(p) for n, p in model.named_parameters()}
    sent = {}
    stats = sync(engine, group, list(new.items()), 1, sent)
    assert "error" not in sent, sent.get("error")
    # what the CPU keeps as it was loaded (embedding, norms, q/k/v biases) is read back on each shard
    assert stats.readback >= 1 + 2 * 2 + 3 * 2, stats
    assert stats.bytes == sent["stats"].bytes
    model.load_state_dict(new, strict=False)
    check_logprobs(engine, model, tok)
    # a sender at another version: both shards refuse the header, and the sender names a shard's rank
    sent = {}
    with pytest.raises(WeightSyncError, match=r"shard [01] of 2: weight sync v2 refused: sender is at version 3"):
        sync(engine, group, list(new.items()), 2, sent, sender_version=3)
    assert isinstance(sent.get("error"), WeightSyncError) and "refused the header" in str(sent["error"])
    check_logprobs(engine, model, tok)  # nothing was loaded
