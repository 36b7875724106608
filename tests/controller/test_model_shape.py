"""`model_shape` reads every key the memory plan counts under its own name, both names of a mixture
of experts, and a hub id's config from the Hugging Face cache only (written from the survivors of
the first mutation run of model_shape.py, benchmarks/mutation/mutation_shape_alerts.json)."""

import json

import pytest

from rlpost.controller.model_shape import hub_config, model_shape

DENSE = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100}
DENSE["num_attention_heads"] = 4


def folder(path, **config):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({**DENSE, **config}))
    return str(path)


@pytest.mark.parametrize(
    "config, named",
    [
        ({"hidden_size": 0}, "hidden_size=0"),
        ({"num_hidden_layers": 0}, "num_hidden_layers=0"),
        ({"intermediate_size": 0}, "intermediate_size=0"),
        ({"vocab_size": 0}, "vocab_size=0"),
        ({"num_attention_heads": 0}, "num_attention_heads=0"),
        ({"num_key_value_heads": 2.5}, "num_key_value_heads=2.5"),
        ({"head_dim": -1}, "head_dim=-1"),
        ({"num_local_experts": 2.5}, "num_experts=2.5"),
        ({"num_local_experts": 4, "num_experts_per_tok": 1.5}, "num_experts_per_tok=1.5"),
        ({"num_local_experts": 4, "moe_intermediate_size": -8}, "intermediate_size=-8"),
    ],
)
def test_a_value_that_is_not_a_positive_integer_is_named_by_its_key(tmp_path, config, named):
    with pytest.raises(ValueError, match=f"config.json: {named} is not a positive integer"):
        model_shape(folder(tmp_path / "m", **config))


def test_both_names_of_a_mixture_of_experts_and_what_a_dense_model_ignores(tmp_path):
    qwen_moe = model_shape(folder(tmp_path / "q", num_experts=4, moe_intermediate_size=32, num_experts_per_tok=2))
    assert (qwen_moe.experts, qwen_moe.intermediate, qwen_moe.active_experts) == (4, 32, 2)
    two = model_shape(folder(tmp_path / "two", num_local_experts=2, moe_intermediate_size=32, num_experts_per_tok=2))
    assert (two.experts, two.intermediate, two.active_experts) == (2, 32, 2)
    unsaid = model_shape(folder(tmp_path / "unsaid", num_local_experts=8))  # no num_experts_per_tok: one
    assert (unsaid.experts, unsaid.intermediate, unsaid.active_experts) == (8, 128, 1)
    # a dense model's config may carry MoE keys with no experts: its MLP and one MLP a token
    dense = model_shape(folder(tmp_path / "dense", moe_intermediate_size=32, num_experts_per_tok=2))
    assert (dense.experts, dense.intermediate, dense.active_experts) == (1, 128, 1)


def test_a_hub_id_is_read_from_the_cache_and_a_local_folder_never_is(tmp_path, monkeypatch):
    import huggingface_hub

    cached = tmp_path / "cached_config.json"
    cached.write_text(json.dumps({**DENSE, "hidden_size": 96}))
    monkeypatch.setattr(  # the cache holds this hub id's config.json, and nothing else
        huggingface_hub, "try_to_load_from_cache", lambda repo, name: str(cached) if name == "config.json" else None
    )
    assert hub_config("org/model") == str(cached)
    assert model_shape("org/model").hidden == 96
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)  # a local folder of that name, without a config.json
    with pytest.raises(FileNotFoundError, match=r"model.path='org/model': no config.json there"):
        model_shape("org/model")


def test_not_a_hub_id_and_a_hub_id_not_cached(monkeypatch):
    import huggingface_hub

    from rlpost.controller import model_shape as module

    assert hub_config("/no/such folder") == ""  # not a hub id: "" (the caller says no config.json there)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: None)
    monkeypatch.setattr("rlpost.models.loading.check_hub_reachable", lambda repo: None)  # the hub answers
    with pytest.raises(FileNotFoundError) as info:
        module.hub_config("org/not-cached")
    assert str(info.value) == (
        "model.path='org/not-cached' is not in the Hugging Face cache: the memory plan reads the model's "
        "config.json and downloads nothing; `huggingface-cli download org/not-cached config.json` fills the cache"
    )
