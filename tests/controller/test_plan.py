"""The memory plan (`rlpost plan`, the start-up check): the parameter count of a model's shape
against transformers' own model, each part of a trainer rank's memory against the formula written
out here, every setting that changes a part at a value where ignoring it would show, and the
refusals naming the knob."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from rlpost.cli import main
from rlpost.config import ConfigError, load_config
from rlpost.controller.plan import GIB, check_plan, gpu_plan, largest_token_budget, model_shape, trainer_plan

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, tied (Qwen2.5 0.5B, 3B, 7B)
    "0.5b": (896, 4864, 24, 14, 2, True),
    "3b": (2048, 11008, 36, 16, 2, True),
    "7b": (3584, 18944, 28, 28, 4, False),
}


def folder(tmp_path, name):
    h, i, layers, heads, kv, tied = SHAPES[name]
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=h,
        intermediate_size=i,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        tie_word_embeddings=tied,
    )
    config.save_pretrained(tmp_path / name)
    return config, str(tmp_path / name)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_parameter_count_is_transformers_own(tmp_path, name):
    config, path = folder(tmp_path, name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert model_shape(path).params == sum(p.numel() for p in model.parameters())


def cfg_of(path, *overrides):
    base = [f"model.path={path}", "trainer.device=cuda", "rollout.backend=vllm", "model.dtype=bfloat16"]
    base.append("trainer.world_size=2")
    return load_config([*base, "trainer.max_tokens_per_microbatch=4096", *overrides], this_machine=False)


def test_each_part_of_a_trainer_rank(tmp_path):
    _, path = folder(tmp_path, "3b")
    s = model_shape(path)
    h, i, layers, v, kv = 2048, 11008, 36, 151936, 2 * 128
    P = s.params
    layer = 2 * h * h + 2 * h * kv + 3 * h * i + h + 2 * kv + 2 * h
    assert s.layer_params == layer and s.root_params == v * h + h
    t = trainer_plan(cfg_of(path, "algo.kl_coef=0.001", "model.attn_implementation=rlpost_varlen"), s)  # packed
    per_token_layer = 2 * (6 * h + 2 * kv + 4 * i) + 8 * h
    want = {
        "weights": 4 * P / 2,  # float32 master shards
        "reference": 2 * P / 2,  # the frozen copy, sharded alike, stored in bfloat16
        "adam": 8 * P / 2,
        "gradients": 4 * P / 2,
        "gathered": 2 * (2 * layer + v * h + h) + 4 * layer,
        "activations": 4096 * layers * per_token_layer,
        "logits": 4096 * v * (2 + 5 * 4),
    }
    assert {k: t[k] for k in want} == pytest.approx(want)
    assert t["peak"] == pytest.approx(sum(want.values()))
    assert t["resident"] == pytest.approx(want["weights"] + want["reference"] + want["adam"])


def test_settings_that_move_memory(tmp_path):
    _, path = folder(tmp_path, "3b")
    s = model_shape(path)
    base = trainer_plan(cfg_of(path), s)
    assert base["reference"] == 0  # kl_coef 0: no reference
    four = trainer_plan(cfg_of(path, "trainer.world_size=4"), s)
    assert four["weights"] == pytest.approx(base["weights"] / 2) and four["activations"] == base["activations"]
    offload = trainer_plan(cfg_of(path, "trainer.param_offload=true"), s)
    assert offload["peak"] == base["peak"] and offload["resident"] == pytest.approx(base["adam"])
    layerwise = trainer_plan(cfg_of(path, "trainer.optim.offload=layerwise"), s)
    assert layerwise["adam"] == pytest.approx(2 * 2 * 4 * s.root_params / 2)  # the root is the largest unit
    assert layerwise["resident"] == pytest.approx(base["weights"])
    passes = sum(base[k] for k in ("gathered", "activations", "logits"))  # the moments' slots come after these
    assert layerwise["peak"] == pytest.approx(base["weights"] + base["gradients"] + max(passes, layerwise["adam"]))
    fixed = base["weights"] + base["gradients"] + max(base["gathered"], layerwise["adam"])  # at no tokens
    assert layerwise["fixed"] == pytest.approx(fixed) and base["fixed"] == pytest.approx(
        base["peak"] - passes + base["gathered"]
    )
    few = ["trainer.optim.offload=layerwise", "trainer.max_tokens_per_microbatch=64", "data.max_prompt_length=16"]
    few.append("rollout.max_response_length=16")  # a sequence of 32 tokens: the budget of 64 is the micro-batch
    few_tokens = trainer_plan(cfg_of(path, *few), s)
    assert few_tokens["peak"] == pytest.approx(base["weights"] + base["gradients"] + layerwise["adam"])
    ref = ["algo.kl_coef=0.001", "trainer.param_offload=true"]  # the reference in the update only when it scores there
    assert trainer_plan(cfg_of(path, *ref), s)["reference"] == pytest.approx(2 * s.params / 2)
    assert trainer_plan(cfg_of(path, *ref, "algo.ppo_mini_batch_size=4"), s)["reference"] == 0
    cpu = trainer_plan(cfg_of(path, "trainer.optim.offload=cpu"), s)
    assert cpu["adam"] == cpu["weights"] == cpu["gradients"] == 0
    tokens = trainer_plan(cfg_of(path, "trainer.max_tokens_per_microbatch=1024"), s)
    assert tokens["activations"] == pytest.approx(base["activations"] / 4)
    rows = ["trainer.max_tokens_per_microbatch=0", "trainer.micro_batch_size=3", "data.max_prompt_length=100"]
    padded = trainer_plan(cfg_of(path, *rows), s)  # sdpa on a GPU: the padded layout
    assert padded["activations"] == pytest.approx(3 * (100 + 256) * 36 * s.activation_bytes_per_token(2))
    assert padded["logits"] == pytest.approx(3 * 256 * 151936 * 22)  # full-length rows, the responses' logits
    packed = trainer_plan(cfg_of(path, *rows, "model.attn_implementation=rlpost_varlen"), s)
    assert packed["logits"] == pytest.approx(3 * 256 * 151936 * 22)  # packed rows too keep the responses' only
    lora = trainer_plan(cfg_of(path, "model.lora.rank=8", "algo.kl_coef=0.001"), s)
    adapter = 36 * 8 * (2 * (h := 2048) * 2 + 2 * (h + 256) + 3 * (h + 11008))
    assert lora["reference"] == 0 and lora["gradients"] == pytest.approx(4 * adapter / 2)
    assert lora["weights"] == pytest.approx(4 * (s.params + adapter) / 2)
    fp32 = trainer_plan(cfg_of(path, "model.dtype=float32"), s)
    assert fp32["logits"] == pytest.approx(base["logits"] * 24 / 22)


def test_refusals_name_the_knob_and_the_worst_case_warns(tmp_path):
    _, path = folder(tmp_path, "7b")
    s = model_shape(path)
    cfg = cfg_of(path, "rollout.gpu_memory_utilization=0.6")
    with pytest.raises(ConfigError, match=r"colocated GPU needs at least .*rollout.gpu_memory_utilization \(now 0.6\)"):
        check_plan(cfg, gpu_plan(cfg, s, 80 * GIB))
    cfg = cfg_of(path, "trainer.world_size=1", "cluster.placement=split")
    with pytest.raises(ConfigError, match=r"trainer GPU .* trainer.optim.offload=layerwise \(the largest part: adam"):
        check_plan(cfg, gpu_plan(cfg, s, 80 * GIB))
    cfg = cfg_of(path, "trainer.max_tokens_per_microbatch=65536", "trainer.optim.offload=layerwise")
    said = []
    check_plan(cfg, gpu_plan(cfg, s, 141 * GIB), said.append)  # fits but for the worst case of the data
    assert len(said) == 1 and "lower trainer.micro_batch_size or trainer.max_tokens_per_microbatch" in said[0]
    said.clear()
    cfg = cfg_of(path, "trainer.max_tokens_per_microbatch=2048", "trainer.optim.offload=layerwise")
    check_plan(cfg, gpu_plan(cfg, s, 141 * GIB), said.append)
    assert said == []
    cfg = cfg_of(
        path,
        "trainer.optim.offload=layerwise",
        "cluster.placement=split",
        "rollout.tensor_parallel_size=3",
        "rollout.enforce_eager=true",
    )
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=3: vLLM splits the model's 28 attention heads"):
        check_plan(cfg, gpu_plan(cfg, s, 141 * GIB))
    cfg.rollout.tensor_parallel_size = 4  # 28 heads and 4 key/value heads divide
    check_plan(cfg, gpu_plan(cfg, s, 141 * GIB), said.append)


def test_the_largest_micro_batch_that_fits_is_the_edge_of_the_plan(tmp_path):
    """It fits and 1024 tokens more do not; a larger GPU or more ranks fit more; one too small: 0."""
    _, path = folder(tmp_path, "3b")
    s, cfg = model_shape(path), cfg_of(path, "trainer.world_size=1")

    def peak(tokens, gpu_gib, c=cfg):
        c.trainer.max_tokens_per_microbatch = tokens
        return gpu_plan(c, s, gpu_gib * GIB)["gpus"]["colocated"]

    budget = largest_token_budget(cfg, s, 141 * GIB)
    room = (141 - 2) * GIB  # two CUDA contexts: trainer and engine
    assert 0 < budget and peak(budget, 141) <= room < peak(budget + 1024, 141)
    assert largest_token_budget(cfg, s, 80 * GIB) < budget
    assert largest_token_budget(cfg_of(path, "trainer.world_size=4"), s, 141 * GIB) > budget
    assert largest_token_budget(cfg, s, 30 * GIB) == 0  # the weights and Adam's states alone do not fit


def test_plan_command(tmp_path, capsys):
    _, path = folder(tmp_path, "7b")
    args = [f"model.path={path}", "trainer.device=cuda", "rollout.backend=vllm", "model.dtype=bfloat16"]
    assert main(["plan", *args, "trainer.world_size=2", "trainer.optim.offload=layerwise", "--gpu-gb", "141"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("model: 7.61B parameters, 28 layers, hidden 3584\nmemory plan per GPU (141 GiB)")
    assert "  the largest micro-batch that fits: " in out and "(trainer.max_tokens_per_microbatch; now " in out
    assert main(["plan", *args, "trainer.world_size=1", "--gpu-gb", "80"]) == 1
    assert "does not fit" in capsys.readouterr().err
    assert main(["plan", "model.path=/no/such/folder"]) == 2
    assert "model.path" in capsys.readouterr().err
    assert json.loads((tmp_path / "7b" / "config.json").read_text())["hidden_size"] == 3584
