"""One layer's LoRA merge (`rlpost.trainer.lora._merged`) against W + scaling * B @ A from
scratch: several adapters, an adapter a layer lacks, a GPT-2 Conv1D ([in, out]), and what it
refuses; `_gather` on a shard kept off its mesh's device."""

import re
from types import SimpleNamespace

import pytest
import torch

from rlpost.trainer.lora import _gather, _merged


class Layers(torch.nn.Module):
    """Two Linear layers, an Embedding and a GPT-2 Conv1D (its weight stored [in, out])."""

    def __init__(self):
        from transformers.pytorch_utils import Conv1D

        super().__init__()
        self.q, self.v = torch.nn.Linear(8, 6), torch.nn.Linear(8, 6, bias=False)
        self.emb = torch.nn.Embedding(10, 8)
        self.conv = Conv1D(6, 8)


def with_adapter(targets, model=None, adapter="default", r=4, alpha=8, **kwargs):
    """`model` (new `Layers` by default) with a peft LoRA `adapter` on `targets`, lora_B random."""
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(len(adapter))
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, **kwargs)
    model = inject_adapter_in_model(config, model if model is not None else Layers(), adapter_name=adapter)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if f".lora_B.{adapter}." in name:
                p.normal_()
    return model


def delta(layer, adapter, scaling):
    """scaling * B @ A of one adapter of `layer`, in float64, from its parameters."""
    a, b = layer.lora_A[adapter].weight.double(), layer.lora_B[adapter].weight.double()
    return scaling * (b @ a)


def check_merge(layer, want):
    weight = layer.base_layer.weight.detach()
    before = weight.clone()
    got = _merged(layer, weight, torch.float32)
    assert got.dtype == torch.float32 and got.shape == weight.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(weight, before), "merging wrote the base weight"


@pytest.mark.filterwarnings("ignore:Already found a `peft_config` attribute:UserWarning")  # two adapters, on purpose
def test_merged_sums_every_active_adapter_and_skips_one_a_layer_lacks():
    """W + sum of scaling * B @ A over the layer's active adapters (each its own scaling: 8/4 and
    1/2); an active adapter that a layer does not hold is skipped and the next ones still merge,
    an inactive one is left out."""
    model = with_adapter(["q", "v"])
    model = with_adapter(["q"], model, adapter="second", r=2, alpha=1)
    q, v = model.q, model.v
    w_q, w_v = q.base_layer.weight.double(), v.base_layer.weight.double()
    q.set_adapter(["default", "second"])
    check_merge(q, w_q + delta(q, "default", 2.0) + delta(q, "second", 0.5))
    q.set_adapter(["second"])
    check_merge(q, w_q + delta(q, "second", 0.5))
    v.set_adapter(["second", "default"])  # "second" has no lora_A on v
    assert "second" not in v.lora_A
    check_merge(v, w_v + delta(v, "default", 2.0))


def test_merged_transposes_a_fan_in_fan_out_layer():
    """A Conv1D keeps its weight as [in, out]: the merge adds (scaling * B @ A) transposed."""
    conv = with_adapter(["conv"], fan_in_fan_out=True).conv
    assert conv.fan_in_fan_out and conv.base_layer.weight.shape == (8, 6)
    check_merge(conv, conv.base_layer.weight.double() + delta(conv, "default", 2.0).T)


@pytest.mark.parametrize(
    "target,kwargs,kind",
    [("q", {"use_dora": True}, "Linear"), ("emb", {}, "Embedding")],
    ids=["dora", "embedding"],
)
def test_merged_refuses_what_is_not_plain_lora_on_a_linear(target, kwargs, kind):
    """DoRA (a magnitude vector besides B @ A) and LoRA on other layers than Linear are refused,
    naming the layer's type, instead of merged as if plain."""
    layer = getattr(with_adapter([target], **kwargs), target)
    message = f"merging {kind} (only plain LoRA on Linear layers)"
    with pytest.raises(NotImplementedError, match=f"^{re.escape(message)}$"):
        _merged(layer, layer.base_layer.weight.detach(), torch.float32)


def test_merged_refuses_an_adapter_merged_already():
    """After peft's `merge()` the base weight holds B @ A already: merging again would add it twice."""
    q = with_adapter(["q"]).q
    q.merge()
    message = "the adapter is merged into the base weights already (layer.merge())"
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        _merged(q, q.base_layer.weight.detach(), torch.float32)


class HostShard:
    """What `_gather` sees of a parameter that FSDP2 keeps on the host for a mesh of another device
    type (CPU offload on a GPU mesh): a DTensor-like value with a `device_mesh`."""

    device_mesh = SimpleNamespace(device_type="meta")

    def __init__(self, value):
        self.value = value

    def detach(self):
        return self

    def to(self, device):
        return self.value.to(device)


def test_gather_brings_a_host_shard_to_its_mesh_device():
    """A sharded parameter is gathered on its mesh's device type, not where its shard lies; a
    plain parameter comes back as its detached value."""
    out = _gather(HostShard(torch.ones(3, 2)))
    assert isinstance(out, torch.Tensor) and out.device.type == "meta" and out.shape == (3, 2)
    param = torch.nn.Parameter(torch.randn(3, 2))
    plain = _gather(param)
    assert torch.equal(plain, param) and not plain.requires_grad
