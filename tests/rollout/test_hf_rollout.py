"""The `hf` rollout backend: the sampling settings reach generation, and the log-probs it reports
are those of the distribution each token was sampled from (temperature, top-k, top-p), checked
against a per-sequence reference forward."""

import pytest
import torch

from rlpost.rollout.base import SamplingParams
from rlpost.rollout.hf import HFRolloutEngine
from tests.helpers import check_sampling, save_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-hf")
    model, tok = save_tiny_model(folder)
    engine = HFRolloutEngine(str(folder), "float32", "cpu", tok.pad_token_id, tok.eos_token_id, batch_size=16)
    return engine, model, tok


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=8, temperature=0.7, max_tokens=8, seed=3),
        SamplingParams(n=8, temperature=1.3, top_k=3, max_tokens=8, seed=3),
        SamplingParams(n=8, temperature=0.9, top_p=0.4, max_tokens=8, seed=3),
        SamplingParams(n=8, temperature=1.0, top_k=5, top_p=0.6, max_tokens=8, seed=3),
        SamplingParams(n=1, max_tokens=8, greedy=True),
    ],
    ids=["temperature", "top_k", "top_p", "top_k_and_top_p", "greedy"],
)
def test_sampling_settings_shape_the_samples_and_their_logprobs(tiny, params):
    engine, model, tok = tiny
    check_sampling(engine, model, tok, params)


def test_the_same_seed_gives_the_same_samples(tiny):
    engine, _, tok = tiny
    prompts = [tok("12+34=")["input_ids"]]
    a, b = (engine.generate(prompts, SamplingParams(n=4, max_tokens=8, seed=5)) for _ in range(2))
    assert torch.equal(a["response_ids"], b["response_ids"])
    c = engine.generate(prompts, SamplingParams(n=4, max_tokens=8, seed=6))
    assert not torch.equal(a["response_ids"], c["response_ids"])
