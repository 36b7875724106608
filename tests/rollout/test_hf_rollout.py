"""The `hf` rollout backend: the sampling settings reach generation, and the log-probs it reports
are those of the distribution each token was sampled from (temperature, top-k, top-p), checked
against a per-sequence reference forward."""

import pytest
import torch

from rlpost.rollout.base import SamplingParams
from rlpost.rollout.hf import HFRolloutEngine
from tests.helpers import FAMILIES, FAMILY_IDS, check_sampling, save_tiny_model, sync_when


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """family id -> (engine, model, tokenizer) of a random model of that family, made once."""
    made = {}

    def make(family_id: str):
        if family_id not in made:
            family, tied = FAMILIES[FAMILY_IDS.index(family_id)]
            folder = tmp_path_factory.mktemp("tiny-hf")
            model, tok = save_tiny_model(folder, family=family, tied=tied)
            engine = HFRolloutEngine(str(folder), "float32", "cpu", tok.pad_token_id, tok.eos_token_id, batch_size=16)
            made[family_id] = engine, model, tok
        return made[family_id]

    return make


@pytest.fixture(params=FAMILY_IDS)
def tiny(engines, request):
    return engines(request.param)


SAMPLING = {
    "temperature": SamplingParams(n=8, temperature=0.7, max_tokens=8, seed=3),
    "top_k": SamplingParams(n=8, temperature=1.3, top_k=3, max_tokens=8, seed=3),
    "top_p": SamplingParams(n=8, temperature=0.9, top_p=0.4, max_tokens=8, seed=3),
    "top_k_and_top_p": SamplingParams(n=8, temperature=1.0, top_k=5, top_p=0.6, max_tokens=8, seed=3),
    "greedy": SamplingParams(n=1, max_tokens=8, greedy=True),
}


@pytest.mark.parametrize(
    "family, setting",
    # every setting on Qwen2; temperature on one Llama, greedy on the other (top-k and top-p act on
    # the logits, whatever made them: CI's minutes saved)
    [("qwen2-tied", s) for s in SAMPLING] + [("llama-untied", "temperature"), ("llama-tied", "greedy")],
)
def test_sampling_settings_shape_the_samples_and_their_logprobs(engines, family, setting):
    engine, model, tok = engines(family)
    check_sampling(engine, model, tok, SAMPLING[setting])


def test_the_same_seed_gives_the_same_samples(tiny):
    engine, _, tok = tiny
    prompts = [tok("12+34=")["input_ids"]]
    a, b = (engine.generate(prompts, SamplingParams(n=4, max_tokens=8, seed=5)) for _ in range(2))
    assert torch.equal(a["response_ids"], b["response_ids"])
    c = engine.generate(prompts, SamplingParams(n=4, max_tokens=8, seed=6))
    assert not torch.equal(a["response_ids"], c["response_ids"])


def test_a_sync_lands_between_two_tokens_and_each_token_records_its_version(tmp_path):
    """A partial rollout: a load (on another thread, as a sync runs in async rollouts) waits for
    the next decoding step, the generation goes on with the new weights, and `token_versions` and
    the log-probs say which weights sampled each token. The new weights differ in the final norm
    only, which the KV cache does not hold: after the switch a token's log-prob is exactly the new
    model's, before it the old model's."""
    import copy
    import threading

    from tests.helpers import reference_logprobs

    model, tok = save_tiny_model(tmp_path)
    engine = HFRolloutEngine(str(tmp_path), "float32", "cpu", tok.pad_token_id, tok.eos_token_id, batch_size=16)
    engine.eos_id = -1  # never stop early: every row spans the switch
    new = copy.deepcopy(model)
    new.model.norm.weight.data.mul_(2.5)
    switch_at, calls, reached = 4, [0], threading.Event()
    point = engine.pauser.point

    def paused_point():  # the generation's 5th decoding step waits until the load has asked
        calls[0] += 1
        if calls[0] == switch_at:
            reached.set()
            while not engine.pauser._loads:
                pass
        point()

    engine.pauser.point = paused_point

    thread = sync_when(reached, engine, new, version=1, timeout=60)
    prompts = [tok(p)["input_ids"] for p in ("12+34=", "7*8=")]
    batch = engine.generate(prompts, SamplingParams(n=3, max_tokens=9, seed=1))
    thread.join(60)
    assert reached.is_set()
    expected = torch.tensor([0] * switch_at + [1] * (9 - switch_at))
    assert torch.equal(batch["token_versions"], expected.expand(6, 9))
    assert torch.equal(batch["weight_version"], torch.zeros(6, dtype=torch.long))  # each row's first token's
    got = batch["rollout_logprobs"]
    old_ref, new_ref = reference_logprobs(model, batch, 1.0), reference_logprobs(new, batch, 1.0)
    assert (got[:, :switch_at] - old_ref[:, :switch_at]).abs().max() < 1e-4
    assert (got[:, switch_at:] - new_ref[:, switch_at:]).abs().max() < 1e-4
    assert (got[:, switch_at:] - old_ref[:, switch_at:]).abs().max() > 1e-2  # the switch shows
