"""The actor's weight sync (`ActorWorker.push_weights`), in one process: a trainer at world size 1
(FSDP2 over gloo) sends to a rollout's end of the sync group received in a thread. Each kind
carries exactly its tensors, in its manifest's names and order, bit for bit: `full` the model's
weights in the compute dtype, `merged` W + (alpha/r) B @ A computed here, `base` the weights as
loaded (no adapter), `adapter` the lora_A/lora_B masters under peft's keys; the stats count the
bytes sent; a kind that does not fit the run is refused by name. `base_checksums`: a LoRA update
leaves the base bitwise as it was, a full fine-tuning update does not."""

import re
import threading

import pytest
import torch
from transformers import AutoTokenizer

from rlpost.config import load_config
from rlpost.trainer.fsdp import full_tensor
from rlpost.weightsync.checksums import checksum
from rlpost.weightsync.manifest import spec_of
from rlpost.weightsync.sync import SyncStats, receive_weights
from rlpost.weightsync.transport import SyncGroup, free_port
from tests.helpers import FAMILIES, FAMILY_IDS, ragged_generation, reference_logprobs, save_tiny_model

LORA = {
    "none": [],
    "merge": ["model.lora.rank=4", "model.lora.alpha=8", "model.lora.mode=merge"],
    "adapter": ["model.lora.rank=4", "model.lora.alpha=8", "model.lora.mode=adapter"],
}
SCALING = 8 / 4  # alpha / rank
TIMEOUT_S = 30  # of the sync group: a sync takes well under a second here


def config(lora: str, *overrides):
    return load_config(
        [
            "+recipe=quickstart",
            "trainer.world_size=1",
            "algo.kl_coef=0",
            "trainer.optim.lr=1e-2",
            "trainer.optim.warmup_steps=1",
            "data.train_batch_size=4",
            "rollout.n=2",
            "weight_sync.bucket_mb=1",  # several buckets
            f"weight_sync.timeout_s={TIMEOUT_S}",
            *LORA[lora],
            *overrides,
        ]
    )


@pytest.fixture
def base(tmp_path, request):
    """(the folder of a tiny model, the model as saved: the from-scratch reference). Qwen2 with
    tied embeddings, or the family a test names (`FAMILY_IDS`, indirect parametrization)."""
    family, tied = FAMILIES[FAMILY_IDS.index(getattr(request, "param", "qwen2-tied"))]
    model, _ = save_tiny_model(tmp_path / "model", family=family, tied=tied)
    return str(tmp_path / "model"), model


@pytest.fixture
def make_worker():
    from rlpost.roles.actor import ActorWorker

    workers = []

    def make(cfg, path):
        workers.append(ActorWorker(cfg, path, 0, 1, "127.0.0.1", free_port()))
        return workers[-1]

    yield make
    for worker in workers:
        worker.shutdown()


def train(worker, model, seed: int = 1) -> None:
    """One update on a random batch (rollout and old log-probs: `model`'s)."""
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch

    batch, g = ragged_generation(seed)
    batch["advantages"] = torch.randn(8, generator=g)
    batch["rollout_logprobs"] = reference_logprobs(model, batch)
    batch["old_logprobs"] = batch["rollout_logprobs"].clone()
    worker.update(shard_batch(batch, step_plan(batch, worker.cfg)[1])[0])


def full(worker) -> dict[str, torch.Tensor]:
    """The worker's parameters under its own (peft) names, full and float32, copied."""
    return {n: full_tensor(p.detach()).clone() for n, p in worker.model.named_parameters()}


class Rollout:
    """A rollout's end (rank 1 of 2) of `worker`'s sync group, receiving in a thread."""

    def __init__(self, worker):
        port, box = free_port(), {}
        connect = lambda: box.update(group=SyncGroup("127.0.0.1", port, 1, 2, "cpu", TIMEOUT_S))  # noqa: E731
        thread = threading.Thread(target=connect, daemon=True)
        thread.start()
        worker.init_weight_sync("127.0.0.1", port, world_size=2, transport="broadcast")
        assert worker.sync_group is not None and worker.sync_group.rank == 0
        thread.join(TIMEOUT_S)
        self.worker, self.group = worker, box["group"]

    def sync(self, version: int, expected: list[tuple[str, torch.Tensor]], kind: str | None = None):
        """`push_weights(version, kind=kind)` received against the manifest of `expected`: (the
        sender's stats, the receiver's stats, the received tensors by name, in order)."""
        got, box = {}, {}

        def receive():
            try:
                manifest = [spec_of(n, t) for n, t in expected]
                load = lambda named: got.update((n, t.clone()) for n, t in named)  # noqa: E731
                box["stats"] = receive_weights(self.group, manifest, version, load, got.get)
            except BaseException as e:  # raised in the test's thread below
                box["error"] = e

        thread = threading.Thread(target=receive, daemon=True)
        thread.start()
        sent = self.worker.push_weights(version, kind=kind)
        assert isinstance(sent, SyncStats), "the sender reports no sync"  # else the receiver waits in vain
        thread.join(TIMEOUT_S)
        if "error" in box:
            raise box["error"]
        return sent, box["stats"], got


def check_received(sent, received, got, expected, version):
    """Every tensor of `expected` arrived bit for bit, in order; both sides counted its bytes."""
    assert list(got) == [n for n, _ in expected]
    for name, want in expected:
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
    nbytes = sum(t.numel() * t.element_size() for _, t in expected)
    assert sent.bytes == nbytes == received.bytes and (sent.version, sent.tensors) == (version, len(expected))
    assert sent.seconds >= sent.header_s + sent.verify_s >= 0 and sent.peak_bytes is None  # on the CPU
    assert (received.version, received.tensors, received.readback) == (version, len(expected), len(expected))


@pytest.mark.parametrize("base", FAMILY_IDS, indirect=True)
@pytest.mark.parametrize("dtype,param_offload", [("float32", False), ("bfloat16", True)])
def test_full_sync_carries_the_model_bit_for_bit(base, make_worker, dtype, param_offload):
    """Without LoRA the default kind is `full`: every parameter under the base model's name, cast
    to the compute dtype; after an update, the updated weights (with `trainer.param_offload` too)."""
    path, model = base
    worker = make_worker(config("none", f"model.dtype={dtype}", f"trainer.param_offload={param_offload}"), path)
    rollout = Rollout(worker)
    cast = getattr(torch, dtype)
    expected = [(n, p.detach().to(cast)) for n, p in model.named_parameters()]
    check_received(*rollout.sync(1, expected), expected, 1)

    train(worker, model)
    now = full(worker)
    assert not torch.equal(now["model.norm.weight"], model.model.norm.weight)
    expected = [(n, now[n].to(cast)) for n, _ in model.named_parameters()]
    check_received(*rollout.sync(2, expected, kind="full"), expected, 2)


def merged_reference(worker, model, dtype=torch.float32) -> list[tuple[str, torch.Tensor]]:
    """W + (alpha/r) B @ A of each adapted weight (W of the model as saved, A and B the worker's,
    each rounded to `dtype` first, as the compute dtype's forward sees them), in float64; every
    other parameter as saved."""
    params = full(worker)
    out = []
    for name, p in model.named_parameters():
        prefix = "base_model.model." + name.removesuffix(".weight")
        if f"{prefix}.lora_A.default.weight" in params:
            w, a, b = (
                t.detach().to(dtype).double()
                for t in (p, params[f"{prefix}.lora_A.default.weight"], params[f"{prefix}.lora_B.default.weight"])
            )
            out.append((name, w + SCALING * (b @ a)))
        else:
            out.append((name, p.detach()))
    return out


@pytest.mark.parametrize("base", FAMILY_IDS, indirect=True)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_merged_sync_is_w_plus_scaled_b_a(base, make_worker, dtype):
    """In merge mode the default kind is `merged`: every base parameter under its base name, in the
    compute dtype; the adapted ones W + (alpha/r) B @ A (within float32 rounding of a float64
    reference; in bfloat16 within one ulp of it with W, A and B rounded first), the others bit for
    bit; the sharded weights stay as they were."""
    path, model = base
    cast = getattr(torch, dtype)
    worker = make_worker(config("merge", f"model.dtype={dtype}"), path)
    rollout = Rollout(worker)
    train(worker, model)  # B leaves 0: the merge is not the base
    before = full(worker)
    reference = merged_reference(worker, model, cast)
    expected = [(n, t.to(cast)) for n, t in reference]
    sent, received, got = rollout.sync(1, expected)
    assert list(got) == [n for n, _ in reference]
    adapted = 0
    for (name, want), (_, saved) in zip(reference, model.named_parameters()):
        assert got[name].dtype == cast, name
        if want.dtype == torch.float64:
            adapted += 1
            assert not torch.equal(got[name], saved.to(cast)), f"{name}: the adapter did not reach the merge"
            if cast == torch.float32:
                torch.testing.assert_close(got[name].double(), want, rtol=1e-6, atol=1e-6, msg=name)
            else:
                ulp = torch.finfo(cast).eps * want.abs().clamp(min=2**-126)
                assert torch.all((got[name].double() - want).abs() <= ulp), name
        else:
            assert torch.equal(got[name], want.to(cast)), name
    assert adapted == 7 * 2
    nbytes = cast.itemsize * sum(p.numel() for p in model.parameters())
    assert sent.bytes == nbytes == received.bytes
    assert (received.version, received.tensors, received.readback) == (1, len(reference), len(reference))
    assert all(torch.equal(t, before[n]) for n, t in full(worker).items()), "merging wrote the weights"


@pytest.mark.parametrize("base", FAMILY_IDS, indirect=True)
def test_base_then_adapter_syncs(base, make_worker):
    """In adapter mode the default kind is `base`: the weights as loaded, without the adapter (an
    update leaves them as they were); then `adapter`: the lora_A/lora_B float32 masters under
    peft's state-dict keys, in the model's order, bit for bit."""
    path, model = base
    worker = make_worker(config("adapter", "model.dtype=bfloat16"), path)
    rollout = Rollout(worker)
    train(worker, model)
    expected = [(n, p.detach().to(torch.bfloat16)) for n, p in model.named_parameters()]
    check_received(*rollout.sync(1, expected), expected, 1)

    adapter = [(n.replace(".default.", "."), t) for n, t in full(worker).items() if ".lora_" in n]
    assert len(adapter) == 2 * 7 * 2 and all(re.fullmatch(r".+\.lora_[AB]\.weight", n) for n, _ in adapter)
    assert any(not torch.equal(t, torch.zeros_like(t)) for n, t in adapter if ".lora_B." in n)
    check_received(*rollout.sync(2, adapter, kind="adapter"), adapter, 2)


@pytest.mark.parametrize(
    "lora,kind,sends",
    [("none", "merged", ["full"]), ("merge", "base", ["merged"]), ("adapter", "full", ["adapter", "base"])],
)
def test_a_kind_that_does_not_fit_the_run_is_refused(base, make_worker, lora, kind, sends):
    """A sync kind this run does not send is refused by name before anything is gathered or sent;
    a rank without a sync group takes part in the gathers only and reports nothing."""
    worker = make_worker(config(lora), base[0])
    rank, mode = (0, "merge") if lora == "none" else (4, lora)
    message = f"weight sync kind {kind!r} does not fit this run (model.lora.rank={rank}, mode={mode}): it sends {sends}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        worker.push_weights(1, kind=kind)
    assert worker.push_weights(1) is None
    assert worker.push_weights(1, kind=sends[-1]) is None


@pytest.mark.parametrize("lora", ["none", "merge"])
def test_base_checksums_move_with_full_fine_tuning_only(base, make_worker, lora):
    """`base_checksums` are the checksums of the base parameters as loaded (world size 1: a shard
    is the whole tensor); a LoRA update (and exporting the merge) leaves them unchanged while the
    adapter moves, a full fine-tuning update changes them to those of the new weights."""
    path, model = base
    worker = make_worker(config(lora), path)
    start = worker.base_checksums()
    assert start == [checksum(p.detach()) for p in model.parameters()]
    before = full(worker)
    train(worker, model)
    worker.push_weights(1)  # no sync group: the export's gathers only
    after = full(worker)
    moved = {n for n in after if not torch.equal(after[n], before[n])}
    if lora == "none":
        assert "model.norm.weight" in moved
        assert worker.base_checksums() == [checksum(after[n]) for n, _ in model.named_parameters()] != start
    else:
        assert moved and all(".lora_" in n for n in moved)
        assert worker.base_checksums() == start


@pytest.mark.parametrize("verify", [True, False])
def test_push_sends_with_the_configured_buckets_and_verification(base, make_worker, monkeypatch, verify):
    """`weight_sync.bucket_mb` (MiB) and `weight_sync.verify` reach the sender; without
    verification the receiver reads nothing back."""
    import rlpost.roles.actor_weights as actor

    calls, send_weights = [], actor.send_weights

    def spy(group, manifest, tensors, version, bucket_bytes, verify=True):
        calls.append((bucket_bytes, verify))
        return send_weights(group, manifest, tensors, version, bucket_bytes, verify)

    monkeypatch.setattr(actor, "send_weights", spy)
    path, model = base
    worker = make_worker(config("none", "weight_sync.bucket_mb=3", f"weight_sync.verify={verify}"), path)
    expected = [(n, p.detach()) for n, p in model.named_parameters()]
    _, received, got = Rollout(worker).sync(4, expected)
    assert calls == [(3 * 2**20, verify)]
    assert received.readback == (len(expected) if verify else 0)
    assert all(torch.equal(got[n], t) for n, t in expected)


def test_init_weight_sync_passes_the_transport_on(base, make_worker):
    """The transport reaches the sync group: CUDA IPC is refused on the CPU, before any peer is
    waited for."""
    worker = make_worker(config("none", "weight_sync.timeout_s=5"), base[0])
    message = "the ipc transport shares CUDA memory; use broadcast on the CPU"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        worker.init_weight_sync("127.0.0.1", free_port(), world_size=2, transport="ipc")
    assert worker.sync_group is None


@pytest.mark.parametrize("base", FAMILY_IDS, indirect=True)
def test_merge_mode_trains_with_the_weights_the_rollout_holds(base, make_worker):
    """In bfloat16 the trainer's log-probs in merge mode are those of a plain model holding the
    synced merged weights, to float32 round-off: the rollout and the trainer compute with the same
    weights, as in full fine-tuning. (W x + s B A x computed apart from the synced bf16(W + s B A)
    differs by a rounding of every adapted weight: on SmolLM2 a gap of nats.)"""
    from transformers import AutoModelForCausalLM

    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.trainer.logprobs import response_logprobs

    path, model = base
    worker = make_worker(config("merge", "model.dtype=bfloat16"), path)
    rollout = Rollout(worker)
    for seed in (1, 2):  # B leaves 0, and far enough that the merge rounds otherwise than W
        train(worker, model, seed)
    expected = [(n, p.detach().to(torch.bfloat16)) for n, p in model.named_parameters()]
    _, _, got = rollout.sync(1, expected)
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    plain.load_state_dict(got, strict=False)  # a tied head follows its embedding
    batch, _ = ragged_generation(5)
    shard = shard_batch(batch, step_plan(batch, worker.cfg)[1])[0]
    trainer = worker.compute_logprobs(shard)
    rows = shard.select(torch.argsort(trainer["row_index"]))
    order = torch.argsort(trainer["row_index"])
    with torch.no_grad():
        rollout_lp, _ = response_logprobs(plain, rows, 1.0, worker.layout)
        base_lp, _ = response_logprobs(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16), rows, 1.0)
    mask = rows["response_mask"]
    gap = (trainer["old_logprobs"][order] - rollout_lp).abs()[mask]
    assert (base_lp - rollout_lp).abs()[mask].max() > 1e-2, "the adapter moved nothing: this would prove nothing"
    assert gap.max() < 1e-5, f"trainer vs rollout log-prob gap {gap.max():.3g}"


@pytest.mark.parametrize("base", FAMILY_IDS, indirect=True)
def test_merge_mode_log_probs_are_full_fine_tunings_on_the_same_weights(base, make_worker, tmp_path):
    """Issue 36 item 4 on one run: a full fine-tuning trainer that holds the weights merge mode
    synced computes merge mode's log-probs bit for bit, so against any rollout of those weights the
    two modes' log-prob gaps are equal, their maximum and their mean (GPU: tests/gpu)."""
    from transformers import AutoModelForCausalLM

    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch

    path, model = base
    lora = make_worker(config("merge", "model.dtype=bfloat16"), path)
    for seed in (1, 2):  # B leaves 0
        train(lora, model, seed)
    expected = [(n, p.detach().to(torch.bfloat16)) for n, p in model.named_parameters()]
    _, _, got = Rollout(lora).sync(1, expected)
    merged = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    assert not merged.load_state_dict(got, strict=False).unexpected_keys  # (a tied head follows its embedding)
    merged.save_pretrained(tmp_path / "merged")
    AutoTokenizer.from_pretrained(path).save_pretrained(tmp_path / "merged")
    full_ft = make_worker(config("none", "model.dtype=bfloat16"), str(tmp_path / "merged"))
    batch, _ = ragged_generation(5)
    shard = shard_batch(batch, step_plan(batch, lora.cfg)[1])[0]
    a, b = lora.compute_logprobs(shard), full_ft.compute_logprobs(shard)
    base_worker = make_worker(config("none", "model.dtype=bfloat16"), path)
    moved = (base_worker.compute_logprobs(shard)["old_logprobs"] - a["old_logprobs"]).abs().max()
    assert moved > 1e-2, "the adapter moved nothing: this would prove nothing"
    assert torch.equal(a["row_index"], b["row_index"])
    assert torch.equal(a["old_logprobs"], b["old_logprobs"]), (a["old_logprobs"] - b["old_logprobs"]).abs().max()
