"""LoRA (rlpost.trainer.lora) on a tiny random Qwen2 (tied embeddings, q/k/v biases), FSDP2 over
gloo on the CPU: merged weights equal peft's merge_and_unload, in the base model's names and
order, while the sharded weights stay bitwise unchanged; yielded tensors survive later steps
(verl #7014); adapter folders and merged exports load in peft and transformers; the merged
forward is LoRA's. One layer's merge: tests/trainer/test_lora_merge.py."""

import copy
import json
import os

import pytest
import torch
import torch.distributed as dist

from rlpost.config import LoraConfig
from rlpost.models.loading import load_causal_lm
from rlpost.models.lora import (
    adapter_key,
    apply_lora,
    base_name,
    base_named_parameters,
    export_merged,
    is_lora_name,
    save_adapter,
)
from rlpost.trainer.lora import adapter_weights, merged_weights
from rlpost.weightsync.transport import free_port
from tests.helpers import FAMILIES, FAMILY_IDS, lora_config, lora_model, run_ranks, save_tiny_model

LORA = lora_config()


def input_ids():
    return torch.randint(3, 60, (2, 10), generator=torch.Generator().manual_seed(2))


def local(p):
    return p.to_local() if hasattr(p, "to_local") else p


def exercise(model, out_dtype) -> dict:
    """Merge (keeping every tensor, and a copy taken as it comes), check the weights, read the
    adapter, then take later steps: in-place updates of the (local) weights, forward, backward."""
    before = {n: local(p).clone() for n, p in model.named_parameters()}
    with torch.no_grad():  # under FSDP2 this leaves the root unit unsharded, in the compute dtype
        model(input_ids=input_ids())
    kept, at_yield = [], []
    for name, t in merged_weights(model, out_dtype):
        kept.append((name, t))
        at_yield.append((name, t.clone()))
    res = {
        "all_sharded": all(hasattr(p, "to_local") for p in model.parameters()),
        "changed": [n for n, p in model.named_parameters() if not torch.equal(local(p), before[n])],
        "adapter": list(adapter_weights(model)),
    }
    with torch.no_grad():
        for p in model.parameters():
            local(p).add_(0.25)
    model(input_ids=input_ids(), labels=input_ids()).loss.backward()
    with torch.no_grad():
        model(input_ids=input_ids())
    return res | {"at_yield": at_yield, "kept": kept}


def rank_main(rank, world, port, base_dir, compute_dtype, out_dtype, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from rlpost.models.checks import decoder_layers
        from rlpost.trainer.fsdp import shard_model

        model = lora_model(base_dir)
        res = {
            "num_layers": len(decoder_layers(model)),
            "trainable": [n for n, p in model.named_parameters() if p.requires_grad],
        }
        res |= exercise(shard_model(model, torch.device("cpu"), compute_dtype), out_dtype)
        if rank == 0:
            torch.save(res, out)
        dist.barrier()  # no rank tears gloo down while a peer still talks to it (SIGABRT seen in CI)
    finally:
        dist.destroy_process_group()


def run_sharded(tmp_path_factory, base_dir, world, compute_dtype, out_dtype):
    out = tmp_path_factory.mktemp(f"world{world}") / "result.pt"
    run_ranks(rank_main, world, free_port(), str(base_dir), compute_dtype, out_dtype, str(out))
    return torch.load(out)


@pytest.fixture(scope="module", params=FAMILIES, ids=FAMILY_IDS)
def base_dir(tmp_path_factory, request):
    family, tied = request.param
    folder = tmp_path_factory.mktemp("base")
    save_tiny_model(folder, hidden=32, layers=2, intermediate=64, family=family, tied=tied)
    return folder


@pytest.fixture(scope="module")
def peft_ref(base_dir):
    return lora_model(base_dir).eval()


@pytest.fixture(scope="module")
def merged_ref(peft_ref):
    """peft's merge_and_unload of an unsharded copy: base name -> float32 tensor, base order."""
    return dict(copy.deepcopy(peft_ref).merge_and_unload().named_parameters())


@pytest.fixture(scope="module")
def world2(tmp_path_factory, base_dir):
    return run_sharded(tmp_path_factory, base_dir, 2, torch.float32, torch.float32)


@pytest.fixture(scope="module")
def unsharded(base_dir):
    """No FSDP: here the base parameters themselves are full, so an un-copied yield would alias them."""
    return exercise(lora_model(base_dir), torch.float32)


@pytest.fixture(scope="module")
def world1_bf16(tmp_path_factory, base_dir):
    return run_sharded(tmp_path_factory, base_dir, 1, torch.bfloat16, torch.bfloat16)


@pytest.fixture(scope="module")
def merged_ref_bf16(peft_ref):
    """The merge as bfloat16 compute sees it: bf16(W) + scaling * bf16(B) @ bf16(A), in float64
    (W, A, B rounded first, as FSDP's mixed precision hands them to the forward)."""
    params = dict(peft_ref.named_parameters())
    out = {}
    for name, p in base_named_parameters(peft_ref):
        value = p.detach().to(torch.bfloat16).double()
        prefix = "base_model.model." + name.removesuffix(".weight")
        if f"{prefix}.lora_A.default.weight" in params:
            a, b = (params[f"{prefix}.lora_{x}.default.weight"].detach().to(torch.bfloat16).double() for x in "AB")
            value = value + lora_config().alpha / lora_config().rank * (b @ a)
        out[name] = value
    return out


def check_merged(named, merged_ref, base_dir, dtype, merged_ref_bf16=None):
    base = dict(load_causal_lm(str(base_dir), "float32").named_parameters())
    assert [n for n, _ in named] == list(base) == list(merged_ref)
    for name, t in named:
        ref = merged_ref[name].detach()
        assert t.dtype == dtype and t.shape == ref.shape, name
        if dtype == torch.float32:
            torch.testing.assert_close(t, ref, rtol=1e-6, atol=1e-6, msg=name)
        else:  # within one bfloat16 rounding of the merge of the rounded W, A and B
            ref = merged_ref_bf16[name]
            ulp = torch.finfo(dtype).eps * ref.abs().clamp(min=2**-126)
            assert torch.all((t.double() - ref).abs() <= ulp), name
    adapted = [n for n in base if n.endswith("proj.weight")]
    assert adapted and all(not torch.equal(merged_ref[n], base[n]) for n in adapted)


def test_names():
    name = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    assert base_name(name) == "model.layers.0.self_attn.q_proj.weight"
    assert base_name("base_model.model.model.norm.weight") == "model.norm.weight"
    lora = "base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight"
    assert is_lora_name(lora) and not is_lora_name(name)
    assert adapter_key(lora) == "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"


def test_apply_lora_freezes_the_base_and_finds_the_layers(world2, peft_ref, base_dir):
    lora = [n for n, _ in peft_ref.named_parameters() if ".lora_A." in n or ".lora_B." in n]
    assert len(lora) == 2 * 7 * 2  # A and B of 7 linears in each of 2 layers, not lm_head
    assert world2["trainable"] == lora and world2["num_layers"] == 2
    names = [n for n, _ in base_named_parameters(peft_ref)]
    assert names == [n for n, _ in load_causal_lm(str(base_dir), "float32").named_parameters()]


def test_an_adapter_on_the_head_is_refused_where_it_is_tied_and_merged_where_not(base_dir):
    """A tied head shares the embedding's weight (an adapter there would merge into both); an
    untied one (Llama 3's) merges like any projection."""
    base = load_causal_lm(str(base_dir), "float32")
    lora = LoraConfig(rank=4, target_modules=["q_proj", "lm_head"])
    if base.config.tie_word_embeddings:
        with pytest.raises(ValueError, match="tied"):
            apply_lora(base, lora)
        return
    model = apply_lora(base, lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.5)
    merged = dict(merged_weights(model, torch.float32))
    reference = dict(copy.deepcopy(model).merge_and_unload().named_parameters())
    assert list(merged) == list(reference)
    assert not torch.equal(merged["lm_head.weight"], base.get_output_embeddings().base_layer.weight)
    for name, t in merged.items():
        torch.testing.assert_close(t, reference[name].detach(), rtol=1e-6, atol=1e-6, msg=name)


def test_merged_weights_match_merge_and_unload_world2(world2, merged_ref, base_dir):
    check_merged(world2["at_yield"], merged_ref, base_dir, torch.float32)
    assert world2["changed"] == [], "merging wrote the sharded weights"
    assert world2["all_sharded"]


def test_merged_weights_world1_bfloat16(world1_bf16, merged_ref, merged_ref_bf16, base_dir):
    check_merged(world1_bf16["at_yield"], merged_ref, base_dir, torch.bfloat16, merged_ref_bf16)
    assert world1_bf16["changed"] == [] and world1_bf16["all_sharded"]


@pytest.mark.parametrize("run", ["world2", "world1_bf16", "unsharded"])
def test_yielded_tensors_survive_later_steps(request, run, merged_ref, merged_ref_bf16, base_dir):
    """verl #7014: merged tensors read after the model moved on must still hold the merge. Here
    all are kept, then the weights are updated in place and forward/backward reuse FSDP buffers."""
    res = request.getfixturevalue(run)
    assert res["changed"] == [], "merging wrote the model's weights"
    for (name, kept), (_, at_yield) in zip(res["kept"], res["at_yield"]):
        assert torch.equal(kept, at_yield), f"{name} changed after it was yielded"
    check_merged(res["kept"], merged_ref, base_dir, res["kept"][0][1].dtype, merged_ref_bf16)


def test_adapter_round_trip_and_merged_export(world2, peft_ref, base_dir, tmp_path):
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM, AutoTokenizer

    expected = get_peft_model_state_dict(peft_ref)
    assert [n for n, _ in world2["adapter"]] == list(expected)
    assert all(torch.equal(t, expected[n]) for n, t in world2["adapter"])

    folder = save_adapter(world2["adapter"], LORA, tmp_path / "adapter", str(base_dir))
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["task_type"]) == (4, 8.0, "CAUSAL_LM")
    assert sorted(config["target_modules"]) == [
        "down_proj",
        "gate_proj",
        "k_proj",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    ]
    assert config["base_model_name_or_path"] == str(base_dir)

    ids = input_ids()
    with torch.no_grad():
        want = peft_ref(input_ids=ids).logits
        loaded = PeftModel.from_pretrained(load_causal_lm(str(base_dir), "float32"), str(folder))
        torch.testing.assert_close(loaded.eval()(input_ids=ids).logits, want, rtol=0, atol=1e-6)

        out = export_merged(str(base_dir), folder, tmp_path / "merged")
        merged = AutoModelForCausalLM.from_pretrained(out).eval()
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=0, atol=1e-5)
    text = "12+34=46"
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == AutoTokenizer.from_pretrained(base_dir)(text).input_ids


@pytest.mark.parametrize("offload", ["none", "layerwise"])
def test_optimizer_holds_the_adapter_only(base_dir, offload):
    """With LoRA only lora_A/lora_B are optimized; the layerwise optimizer's units are the decoder
    layers' adapters (the root unit -- embeddings, norm, tied head -- has none and is dropped)."""
    from rlpost.config import OptimConfig
    from rlpost.trainer.engine import build_optimizer

    model = lora_model(base_dir)
    optimizer = build_optimizer(model, OptimConfig(offload=offload))
    optimized = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert sorted(optimized) == sorted(id(p) for n, p in model.named_parameters() if is_lora_name(n))
    if offload == "layerwise":
        assert len(optimizer.units) == 2 and all(len(u) == 2 * 7 for u in optimizer.units)


def test_the_merged_forward_is_loras_and_so_is_its_gradient(base_dir):
    """`use_merged_forward` (model.lora.mode=merge) computes x @ (W + s B A)^T in one product: in
    float32 the outputs and the adapter's gradients are peft's (round-off apart), the frozen
    weights get none; with the adapter disabled (the KL reference) it is the base model."""
    from rlpost.trainer.lora_forward import MergedLoraLinear, use_merged_forward

    peft = lora_model(base_dir)
    merged = copy.deepcopy(peft)
    use_merged_forward(merged)
    assert sum(isinstance(m, MergedLoraLinear) for m in merged.modules()) == 7 * 2
    ids = input_ids()
    losses = []
    for model in (peft, merged):
        logits = model(input_ids=ids).logits
        losses.append((logits * torch.linspace(-1, 1, logits.shape[-1])).sum())
        losses[-1].backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-4)
    grads = {n: p.grad for n, p in peft.named_parameters() if p.requires_grad}
    assert all(g.abs().max() > 0 for g in grads.values())
    for name, p in merged.named_parameters():
        if name in grads:
            scale = grads[name].abs().max()
            assert (p.grad - grads[name]).abs().max() <= 1e-4 * scale, name  # float32 round-off
        else:
            assert p.grad is None, name
    with torch.no_grad(), merged.disable_adapter():
        base = load_causal_lm(str(base_dir), "float32")(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, base, rtol=0, atol=1e-6)
