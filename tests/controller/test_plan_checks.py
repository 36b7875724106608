"""The memory plan's edges, on plans written out by hand in whole GiB: the room a GPU leaves after
its CUDA contexts (two colocated, one split), what each kind of GPU must hold, the exact messages
of a refusal and of the worst-case warning, the printed plan, the largest micro-batch at the exact
edge of a GPU, a config.json's defaults and the settings that change a part's formula."""

import json

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller.plan import (
    GIB,
    ModelShape,
    check_plan,
    format_plan,
    gpu_plan,
    largest_token_budget,
    model_shape,
    shape_of,
    trainer_plan,
)

SHAPE = ModelShape(hidden=64, layers=2, intermediate=128, vocab=1000, heads=16, kv_heads=2, tied=True)
BASE = ["model.path=org/model", "trainer.device=cuda", "rollout.backend=vllm", "model.dtype=bfloat16"]


def cfg_of(*overrides):
    return load_config([*BASE, "trainer.max_tokens_per_microbatch=4096", *overrides], this_machine=False)


def plan_of(awake_gib: float, gpus: dict, **gib) -> dict:
    """A plan of parts given in GiB: weights, reference, adam, gradients, gathered, activations,
    logits and resident; its peak is their sum (all but resident), its fixed part the peak at no tokens."""
    names = ("weights", "reference", "adam", "gradients", "gathered", "activations", "logits", "critic", "reward_model")
    parts = dict.fromkeys(names, 0.0)
    parts.update({k: v * GIB for k, v in gib.items() if k != "resident"})
    peak, fixed = sum(parts.values()), sum(parts.values()) - parts["activations"] - parts["logits"]
    trainer = {**parts, "peak": peak, "fixed": fixed, "resident": gib["resident"] * GIB, "slots_apart": 0.0}
    return {"trainer": trainer, "rollout_awake": awake_gib * GIB, "gpus": {k: v * GIB for k, v in gpus.items()},
            "gpu_bytes": 10 * GIB, "shape": SHAPE}  # fmt: skip


def test_a_colocated_refusal_names_the_fixed_need_the_room_after_two_contexts_and_the_largest_part():
    """10 GiB colocated: 8 GiB after two contexts; the update's fixed parts (3 + 6 + 1.5 + 0.5 = 11)
    do not fit whatever the data, and Adam (6 GiB) is the largest part."""
    cfg = cfg_of("rollout.backend=hf")
    plan = plan_of(0, {"colocated": 14}, weights=3, adam=6, gradients=1.5, gathered=0.5, activations=2, logits=1,
                   resident=9)  # fmt: skip
    with pytest.raises(ConfigError) as info:
        check_plan(cfg, plan)
    assert str(info.value) == (
        "the memory plan does not fit: a colocated GPU needs at least 11.0 GiB of 10.0 GiB (8.0 GiB after the "
        "CUDA contexts); change trainer.optim.offload=layerwise (the largest part: adam, 6.0 GiB). "
        "`rlpost plan` prints the whole plan."
    )


def test_split_gpus_that_hold_exactly_their_room_fit_without_a_warning():
    """Split, 10 GiB: 9 GiB after one context. A trainer peak of exactly 9 and an engine of exactly 9
    fit; the trainer's memory between phases does not count on the engine's GPU."""
    cfg = cfg_of("cluster.placement=split")
    plan = plan_of(9, {"trainer": 9, "rollout": 9}, weights=2, adam=4, gradients=1, gathered=1, activations=0.5,
                   logits=0.5, resident=6)  # fmt: skip
    said = []
    check_plan(cfg, plan, said.append)
    assert said == []


def test_an_engine_too_large_for_its_split_gpu_names_the_memory_utilization():
    cfg = cfg_of("cluster.placement=split", "rollout.gpu_memory_utilization=0.95")
    plan = plan_of(9.5, {"trainer": 9, "rollout": 9.5}, weights=2, adam=3, gradients=1, gathered=1, activations=1,
                   logits=1, resident=5)  # fmt: skip
    with pytest.raises(ConfigError) as info:
        check_plan(cfg, plan)
    assert str(info.value) == (
        "the memory plan does not fit: a rollout GPU needs at least 9.5 GiB of 10.0 GiB (9.0 GiB after the CUDA "
        "contexts); change rollout.gpu_memory_utilization (now 0.95) or the trainer's memory between phases "
        "(5.0 GiB: trainer.param_offload=true, trainer.optim.offload=layerwise). `rlpost plan` prints the whole plan."
    )


def test_resident_memory_and_an_awake_engine_equal_to_the_fixed_parts_name_the_engine():
    """Colocated: resident 5 + engine 4 = fixed 9 > room 8: the engine and the memory between
    phases are what to change (at equality as above it)."""
    cfg = cfg_of("rollout.gpu_memory_utilization=0.4")
    plan = plan_of(4, {"colocated": 10}, weights=2, adam=3, gradients=2, gathered=2, activations=1, resident=5)
    with pytest.raises(ConfigError, match=r"at least 9.0 GiB .* change rollout.gpu_memory_utilization \(now 0.4\)"):
        check_plan(cfg, plan)


def test_the_worst_case_warning_gives_the_peak_and_its_parts():
    cfg = cfg_of()
    plan = plan_of(0, {"colocated": 9.5}, weights=2, adam=3, gradients=1, gathered=0.5, activations=2, logits=1,
                   resident=5)  # fmt: skip
    said = []
    check_plan(cfg, plan, said.append)
    assert said == [
        "memory plan: a colocated GPU may need up to 9.5 GiB of 10.0 GiB with micro-batches of 4096 tokens at full "
        "length (activations 2.0, logits 1.0 GiB); if the update runs out of memory, lower trainer.micro_batch_size "
        "or trainer.max_tokens_per_microbatch"
    ]


def test_tensor_parallel_shards_must_split_the_heads():
    """16 heads, 2 key/value heads: 4 shards divide the heads and are a multiple of 2; 28 heads do
    not split over 8 shards even though 8 is a multiple of 4 key/value heads."""
    fits = plan_of(0, {"colocated": 1}, weights=0.5, resident=0.5)
    check_plan(cfg_of("cluster.placement=split", "rollout.tensor_parallel_size=4", "rollout.enforce_eager=true"), fits)
    odd = {**fits, "shape": ModelShape(64, 2, 128, 1000, heads=28, kv_heads=4, tied=True)}
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=8: vLLM splits the model's 28 attention heads"):
        check_plan(
            cfg_of("cluster.placement=split", "rollout.tensor_parallel_size=8", "rollout.enforce_eager=true"), odd
        )


def test_the_printed_plan():
    plan = plan_of(4, {"colocated": 14}, weights=3, adam=6, gradients=1.5, gathered=0.5, activations=2, logits=1,
                   resident=9)  # fmt: skip
    plan["gpu_bytes"] = 80 * GIB
    assert format_plan(plan) == (
        "memory plan per GPU (80 GiB), GiB:\n"
        "  trainer rank at its peak (the update): weights 3.00, adam 6.00, gradients 1.50, activations 2.00, "
        "logits 1.00, gathered 0.50 = 14.00; between phases 9.00\n"
        "  vLLM engine awake: 4.00 (rollout.gpu_memory_utilization)\n"
        "  colocated GPU peak: 14.00 (+1 per process: CUDA context)"
    )


def test_an_engine_that_is_not_vllm_takes_no_gpu_and_a_colocated_gpu_adds_the_engine_to_the_resident():
    cfg = cfg_of("cluster.placement=split", "rollout.backend=hf")
    plan = gpu_plan(cfg, SHAPE, 80 * GIB)
    assert plan["rollout_awake"] == 0.0 and plan["gpus"] == {"trainer": plan["trainer"]["peak"], "rollout": 0.0}
    cfg = cfg_of("rollout.gpu_memory_utilization=0.5")  # the tiny shape's update is far below 40 GiB
    plan = gpu_plan(cfg, SHAPE, 80 * GIB)
    assert plan["gpus"]["colocated"] == plan["trainer"]["resident"] + 40 * GIB


def peak_at(cfg, shape, tokens: int, gpu_bytes: float) -> float:
    cfg.trainer.max_tokens_per_microbatch = tokens
    return max(p for kind, p in gpu_plan(cfg, shape, gpu_bytes)["gpus"].items() if kind != "rollout")


@pytest.mark.parametrize(
    "placement, contexts, engine",
    [("colocate", 2, "rollout.backend=hf"), ("split", 1, "rollout.gpu_memory_utilization=0.99")],
)
def test_the_largest_micro_batch_at_the_exact_edge_of_the_gpu(placement, contexts, engine):
    """A GPU whose room (after 2 contexts colocated, 1 split) is exactly the peak at 4096 tokens fits
    4096; one byte less fits 3072. The answer is an int, a multiple of 1024. Split, the engine's own
    GPU (here fuller than the room) does not bound the trainer's micro-batch."""
    cfg = cfg_of(f"cluster.placement={placement}", engine, "trainer.micro_batch_size=1")
    big = ModelShape(hidden=512, layers=4, intermediate=1024, vocab=100_000, heads=8, kv_heads=8, tied=False)
    edge = peak_at(cfg, big, 4096, 100 * GIB) + contexts * GIB
    for gpu, want in ((edge, 4096), (edge - 1, 3072)):
        budget = largest_token_budget(cfg, big, gpu)
        assert budget == want and isinstance(budget, int)
    assert largest_token_budget(cfg, big, 10_000 * GIB) == 256 * 1024  # the cap
    fine = largest_token_budget(cfg, big, edge, step=100)  # the edge at a finer step: 4000 fits, 4100 not
    assert fine == 4000 and isinstance(fine, int)


def write_config(folder, **config):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_a_config_json_nested_in_text_config_and_its_defaults(tmp_path):
    inner = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000}
    path = write_config(tmp_path / "vlm", text_config={**inner, "num_attention_heads": 16}, vision_config={})
    assert model_shape(path) == ModelShape(64, 2, 128, 1000, heads=16, kv_heads=16, tied=False)
    with pytest.raises(ValueError, match=r"config.json: no 'num_attention_heads' \(the memory plan reads decoder"):
        model_shape(write_config(tmp_path / "bad", **inner))
    with pytest.raises(FileNotFoundError, match=r"model.path='/no/model': no config.json there"):
        model_shape("/no/model")
    cfg = cfg_of(f"model.path={path}")
    assert shape_of(cfg) == model_shape(path)  # model.path unless a folder is given
    tiny = load_config(["+recipe=quickstart"]).model.tiny
    assert shape_of(cfg, "tiny").tied is True and shape_of(cfg, "tiny").hidden == tiny.hidden_size


def test_lora_and_offload_formulas_written_out():
    """SHAPE: h 64, kv width 2 * 4 = 8, i 128, 2 layers; layer 2*64*64 + 2*64*8 + 3*64*128 + 64 +
    16 + 128 = 34000 parameters, root 1000 * 64 + 64 = 64064, all 132064."""
    assert SHAPE.layer_params == 34000 and SHAPE.root_params == 64064 and SHAPE.params == 132064
    assert SHAPE.lora_params(1, ["q_proj", "v_proj"]) == 2 * ((64 + 64) + (64 + 8))
    full = trainer_plan(cfg_of("trainer.world_size=2"), SHAPE)
    assert full["weights"] == 4 * 132064 / 2  # exactly: no adapter added
    rank1 = trainer_plan(cfg_of("trainer.world_size=2", "model.lora.rank=1", "trainer.optim.offload=layerwise"), SHAPE)
    adapter = 2 * (2 * 128 + 2 * 72 + 2 * 192 + 192)  # all-linear at rank 1: q, o (64+64), k, v (64+8), MLP
    assert rank1["gradients"] == 4 * adapter / 2
    assert rank1["gathered"] == 2 * (2 * 34000 + 64064)  # no float32 gradient unit gathered with LoRA
    assert rank1["adam"] == pytest.approx(2 * 2 * 4 * 64064 * (adapter / 132064) / 2)
    assert rank1["resident"] == rank1["weights"]  # the moments live on the host
    offloaded = trainer_plan(cfg_of("trainer.param_offload=true", "trainer.optim.offload=layerwise"), SHAPE)
    assert offloaded["resident"] == 0.0


def test_the_printed_plan_with_adams_slots_apart_gives_the_peak_at_once():
    plan = plan_of(0, {"colocated": 12}, weights=3, adam=6, gradients=1.5, gathered=0.5, activations=2, resident=3)
    plan["trainer"].update(peak=12 * GIB, slots_apart=1.0)  # layerwise: the slots after the passes
    assert format_plan(plan).splitlines()[1] == (
        "  trainer rank at its peak (the update): weights 3.00, adam 6.00, gradients 1.50, activations 2.00, "
        "gathered 0.50; at once 12.00 (Adam's layerwise slots in the optimizer step, after the passes); "
        "between phases 3.00"
    )


@pytest.mark.parametrize("placement, gib", [("split", 1), ("colocate", 2)])
def test_a_gpu_whose_room_is_exactly_its_contexts_is_refused_before_any_advice(placement, gib):
    plan = plan_of(0, {"colocated": 0}, resident=0)
    plan["gpu_bytes"] = gib * GIB
    with pytest.raises(ConfigError, match=rf"a GPU of {gib} GiB .* does not hold even the CUDA contexts \({gib} GiB\)"):
        check_plan(cfg_of(f"cluster.placement={placement}", "rollout.backend=hf"), plan)


def test_a_refusal_names_the_largest_part_when_the_engine_is_not_what_overflows():
    """An engine is awake beside the trainer (colocated) or on its own GPU (split), but the update's
    fixed parts alone (11 GiB) overflow the room: Adam is what to change, not the engine, also when the
    memory between phases equals the fixed parts on a split trainer's GPU (no engine there)."""
    colocated = plan_of(2, {"colocated": 12}, weights=3, adam=6, gradients=1.5, gathered=0.5, resident=4)
    split = plan_of(5, {"trainer": 12, "rollout": 5}, weights=3, adam=6, gradients=1.5, gathered=0.5, resident=11)
    for cfg, plan in (
        (cfg_of("rollout.gpu_memory_utilization=0.2"), colocated),
        (cfg_of("cluster.placement=split"), split),
    ):
        with pytest.raises(ConfigError, match=r"change trainer.optim.offload=layerwise \(the largest part: adam"):
            check_plan(cfg, plan)


def test_the_trainers_peak_adds_adams_slots_only_when_they_live_apart():
    """Exact bytes: without offload the moments are kept with the weights and the passes come on top;
    layerwise, the larger of the passes and the slots comes on top of the rest."""
    for offload in ("none", "layerwise"):
        short = ["data.max_prompt_length=1", "rollout.max_response_length=1"]  # sequences of 2 tokens
        t = trainer_plan(
            cfg_of("trainer.max_tokens_per_microbatch=1", f"trainer.optim.offload={offload}", *short), SHAPE
        )
        kept = t["weights"] + t["reference"] + t["gradients"] + (t["adam"] if offload == "none" else 0)
        passes = t["gathered"] + t["activations"] + t["logits"]
        assert t["adam"] > passes  # (two tokens a micro-batch: the slots are the larger)
        assert t["peak"] == kept + (max(passes, t["adam"]) if offload == "layerwise" else passes)


def test_the_gpu_size_is_the_given_one_else_this_gpus_else_80_gib_assumed(monkeypatch):
    """`rlpost plan`'s GPU: --gpu-gb, else the GPU here (its total memory, not assumed), else 80 GiB,
    said as assumed (mutation_export_plan.json's survivors: only the path without a GPU ran)."""
    import torch

    from rlpost.controller.plan import GIB, gpu_size

    assert gpu_size(141.0) == (141.0, False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_size(None) == (80.0, True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (3 * GIB, 139.5 * GIB, 0))  # (free, total)
    assert gpu_size(None) == (139.5, False)


@pytest.mark.parametrize(
    ("params", "said"),
    [(1_050_000, "1.1M"), (999_999_999, "1000.0M"), (1_000_000_000, "1.00B"), (1_015_000_001, "1.02B")],
)
def test_the_plans_header_gives_the_models_size_in_a_unit_that_fits(params, said):
    from types import SimpleNamespace

    from rlpost.controller.plan import plan_header

    cfg = load_config(["+recipe=quickstart", "trainer.device=cuda"], this_machine=False)
    shape = SimpleNamespace(params=params, layers=4, hidden=128)
    assert plan_header(cfg, shape, 80.0, False) == f"model: {said} parameters, 4 layers, hidden 128"
