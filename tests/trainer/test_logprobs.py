"""Property tests of the token layout and log-prob alignment (docs/token-layout.md).

Random ragged batches: prompt lengths 1..P, response lengths 0..R (empty and full included), EOS
inside responses (multi-turn: several), holes in the loss mask (an environment's tokens), batch
sizes 1..16, rows drawing their prompts from a pool of 1..B prompts (GRPO's groups, in any order).
On Qwen2 and Llama models, tied and untied, in float32, packed == padded == shared_prompt == a
per-sequence reference computed with no padding at all, log-probs and gradients; results do not
depend on micro-batch size or sample order; and pack -> unpack is the identity for per-token
tensors.
"""

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rlpost.data.batch import Batch
from rlpost.data.padding import left_pad, pack, pack_tokens, right_pad, unpack_tokens
from rlpost.trainer.logprobs import LAYOUTS, response_logprobs, response_values
from tests.helpers import FAMILIES, FAMILY_IDS, examples, reference_logprobs, tiny_model

VOCAB, EOS, PAD, P, R = 50, 1, 0, 12, 10
SETTINGS = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", params=FAMILIES, ids=FAMILY_IDS)
def model(request):
    family, tied = request.param
    return tiny_model(hidden=32, layers=2, intermediate=64, family=family, tied=tied)[0]


@st.composite
def ragged_batches(draw):
    """A generation-layout batch; responses may be empty, full width, or end in an EOS."""
    b = draw(st.integers(1, 16))
    token = st.integers(2, VOCAB - 1)
    pool = draw(st.lists(st.lists(token, min_size=1, max_size=P), min_size=1, max_size=b))
    prompts, responses = [], []
    for _ in range(b):
        prompts.append(draw(st.sampled_from(pool)))  # rows of one prompt: a group, wherever it sits
        resp = draw(st.lists(token, min_size=0, max_size=R))
        if resp and draw(st.booleans()):
            resp[-1] = EOS  # finished with EOS inside the width
        for j in draw(st.lists(st.integers(0, max(len(resp) - 1, 0)), max_size=3)) if resp else []:
            resp[j] = EOS  # multi-turn: each of the model's turns ends with EOS inside the response
        responses.append(resp)
    width = max(max(len(r) for r in responses), draw(st.integers(0, R)))
    prompt_ids, prompt_mask = left_pad(prompts, PAD)
    response_ids, response_mask = right_pad(responses, PAD, width=width)
    # the model's own tokens: holes where a tool or an environment wrote, anywhere in a response
    holes = torch.tensor(draw(st.lists(st.booleans(), min_size=b * width, max_size=b * width)), dtype=torch.bool)
    holes = holes.view(b, width)
    return Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "loss_mask": response_mask & ~holes,
        }
    )


def in_micro_batches(model, batch, size, layout):
    parts = [
        response_logprobs(model, batch.select(slice(i, i + size)), 0.7, layout)[0] for i in range(0, len(batch), size)
    ]
    width = batch["response_ids"].shape[1]
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])


@SETTINGS
@given(batch=ragged_batches())
def test_every_layout_equals_per_sequence(model, batch):
    with torch.no_grad():
        ref = reference_logprobs(model, batch, 0.7)
        for layout in LAYOUTS:
            got, _ = response_logprobs(model, batch, 0.7, layout=layout)
            assert got.shape == ref.shape, layout
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-5, msg=layout)
            assert torch.all(got[~batch["response_mask"]] == 0), layout


def test_shared_prompts_run_once_and_their_gradient_is_the_padded_one(model):
    """GRPO's layout: 3 prompts of different lengths x 4 samples, interleaved. shared_prompt runs
    the 3 distinct prompts once (a forward of 3 rows, then one of the 12 responses), and the
    gradient of a weighted sum of log-probs, taken back through the shared keys and values, is
    the padded layout's."""
    prompts = [[5, 6, 7, 8], [9], [10, 11]] * 4
    responses = [[12 + i % 5, 13, EOS][: 1 + i % 3] for i in range(12)]
    prompt_ids, prompt_mask = left_pad(prompts, PAD)
    response_ids, response_mask = right_pad(responses, PAD)
    batch = Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
        }
    )
    rows = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: rows.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    weights = torch.randn(response_mask.shape, generator=torch.Generator().manual_seed(0))
    grads = {}
    try:
        for layout in ("padded", "shared_prompt"):
            rows.clear()
            model.zero_grad()
            logp, _ = response_logprobs(model, batch, 0.7, layout=layout)
            (logp * weights).sum().backward()
            grads[layout] = torch.cat([p.grad.flatten() for p in model.parameters()])
            forwards = {"padded": [torch.Size([12, 7])], "shared_prompt": [torch.Size([3, 4]), torch.Size([12, 3])]}
            assert rows == forwards[layout], layout
        # a value model's values (read from the same positions) run the same forwards per layout
        values = {}
        with torch.no_grad():
            for layout, forwards in (
                ("packed", [torch.Size([1, 52])]),  # 28 prompt + 24 response tokens
                ("padded", [torch.Size([12, 7])]),
                ("shared_prompt", [torch.Size([3, 4]), torch.Size([12, 3])]),
            ):
                rows.clear()
                values[layout] = response_values(model, batch, layout)
                assert rows == forwards, layout
    finally:
        hook.remove()
        model.zero_grad()
    assert grads["padded"].abs().sum() > 0
    torch.testing.assert_close(grads["shared_prompt"], grads["padded"], rtol=1e-4, atol=1e-6)
    for layout in ("packed", "shared_prompt"):
        torch.testing.assert_close(values[layout], values["padded"], rtol=0, atol=1e-5)


def test_the_cache_argument_is_named_as_the_model_names_it():
    """transformers 5's `cache`, 4.x's `past_key_values`, read from the model under a wrapper
    that takes `**kwargs` and hands out the model it wraps (peft's `get_base_model`)."""
    from rlpost.trainer.logprobs import _cache_keyword

    class New:
        def forward(self, input_ids=None, cache=None): ...

    class Old:
        def forward(self, input_ids=None, past_key_values=None): ...

    class Wrapper:
        def __init__(self, model):
            self.model = model

        def forward(self, *args, **kwargs): ...

        def get_base_model(self):
            return self.model

    assert [_cache_keyword(m) for m in (New(), Old(), Wrapper(New()), Wrapper(Old()))] == [
        "cache",
        "past_key_values",
        "cache",
        "past_key_values",
    ]


@SETTINGS
@given(batch=ragged_batches(), size=st.integers(1, 16), seed=st.integers(0, 2**16), layout=st.sampled_from(LAYOUTS))
def test_micro_batch_size_and_order_do_not_matter(model, batch, size, seed, layout):
    with torch.no_grad():
        whole, _ = response_logprobs(model, batch, 0.7, layout=layout)
        micro = in_micro_batches(model, batch, size, layout)
        perm = torch.randperm(len(batch), generator=torch.Generator().manual_seed(seed))
        shuffled, _ = response_logprobs(model, batch.select(perm), 0.7, layout=layout)
    torch.testing.assert_close(micro, whole, rtol=0, atol=1e-5)
    torch.testing.assert_close(shuffled[torch.argsort(perm)], whole, rtol=0, atol=1e-5)


@settings(max_examples=examples(300), deadline=None)
@given(batch=ragged_batches(), seed=st.integers(0, 2**16))
def test_pack_then_unpack_is_identity(batch, seed):
    p = pack(batch)
    mask = batch["response_mask"]
    values = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed)) * mask
    assert torch.equal(unpack_tokens(pack_tokens(values, p), p), values)
    # the packed row holds exactly the real tokens, with positions restarting per sequence
    assert p.input_ids.shape[1] == int(batch["prompt_mask"].sum() + mask.sum())
    starts = p.cu_seqlens[:-1].long()
    assert torch.all(p.position_ids[0, starts] == 0)
    assert torch.equal(unpack_tokens(p.input_ids[0], p), batch["response_ids"] * mask)


def buggy_logprobs_5115(model, batch: Batch, temperature: float) -> torch.Tensor:
    """The bug class of verl PR #5115: prompts *right*-padded (real tokens first), then the
    response log-probs sliced at a fixed offset `[:, P - 1 : -1]` that ignores each row's own
    prompt length. Correct only when every prompt has the same length."""
    prompts = [ids[m].tolist() for ids, m in zip(batch["prompt_ids"], batch["prompt_mask"])]
    prompt_ids, prompt_mask = right_pad(prompts, PAD)
    ids = torch.cat([prompt_ids, batch["response_ids"]], dim=1)
    attn = torch.cat([prompt_mask, batch["response_mask"]], dim=1).long()
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float() / temperature
    width = prompt_ids.shape[1]
    logp = torch.log_softmax(logits[:, width - 1 : -1], dim=-1)
    return logp.gather(-1, batch["response_ids"].unsqueeze(-1)).squeeze(-1) * batch["response_mask"]


def test_the_property_catches_the_5115_bug_class(model):
    @settings(max_examples=examples(50), deadline=None, database=None, phases=[Phase.generate])  # no shrinking
    @given(batch=ragged_batches())
    def alignment_holds(batch):
        with torch.no_grad():
            got = buggy_logprobs_5115(model, batch, 0.7)
            torch.testing.assert_close(got, reference_logprobs(model, batch, 0.7), rtol=0, atol=1e-5)

    with pytest.raises(AssertionError):
        alignment_holds()
    # and it is the ragged prompts that break it: with equal prompt lengths the slice is right
    equal = Batch(
        {
            "prompt_ids": torch.tensor([[5, 6], [7, 8]]),
            "prompt_mask": torch.ones(2, 2, dtype=torch.bool),
            "response_ids": torch.tensor([[9, 1], [9, 0]]),
            "response_mask": torch.tensor([[True, True], [True, False]]),
        }
    )
    with torch.no_grad():
        torch.testing.assert_close(
            buggy_logprobs_5115(model, equal, 0.7), reference_logprobs(model, equal, 0.7), rtol=0, atol=1e-5
        )


@settings(max_examples=examples(300), deadline=None)
@given(batch=ragged_batches(), size=st.integers(1, 5), world=st.integers(1, 3), budget=st.integers(0, 30))
def test_a_loss_mask_with_holes_keeps_its_place_through_every_layout(batch, size, world, budget):
    """Packing, trimming, splitting into ranks and micro-batches and concatenating again move a
    loss mask with holes exactly as they move the response tokens it marks."""
    from rlpost.data.microbatch import plan_step, shard_batch
    from rlpost.data.padding import check_masks, concat_generations, trim_padding

    check_masks(batch)
    loss = batch["loss_mask"]
    p = pack(batch)
    assert torch.equal(unpack_tokens(pack_tokens(loss.float(), p), p).bool(), loss)
    trimmed = trim_padding(batch)
    assert torch.equal(trimmed["loss_mask"], loss[:, : trimmed["response_ids"].shape[1]])
    assert not loss[:, trimmed["response_ids"].shape[1] :].any()
    lengths = (batch["prompt_mask"].sum(-1) + batch["response_mask"].sum(-1)).tolist()
    try:
        plan = plan_step(lengths, world, 1, budget, size)
    except ValueError as e:  # too few rows for the ranks, or for the micro-batches the budget asks
        assert len(lengths) < world or ("micro-batches" in str(e) and (budget or size)), str(e)
        plan = None
    if plan is not None:
        back = Batch.cat(shard_batch(batch, plan))
        order = torch.argsort(back["row_index"])
        assert torch.equal(back["loss_mask"][order], loss)
        assert torch.equal(back["response_ids"][order], batch["response_ids"])
    halves = [batch.select(slice(0, len(batch) // 2)), batch.select(slice(len(batch) // 2, None))]
    again = concat_generations([trim_padding(h) for h in halves if len(h)], PAD)
    assert torch.equal(again["loss_mask"], loss[:, : again["loss_mask"].shape[1]])


def test_a_loss_mask_outside_the_response_is_refused():
    from rlpost.data.padding import check_masks

    mask = torch.tensor([[True, True, False]])
    ok = Batch({"response_mask": mask, "loss_mask": torch.tensor([[False, True, False]])})
    check_masks(ok)
    with pytest.raises(ValueError, match="row 0: loss_mask marks tokens outside response_mask"):
        check_masks(Batch({"response_mask": mask, "loss_mask": torch.tensor([[True, False, True]])}))
    with pytest.raises(ValueError, match="prefix"):
        check_masks(Batch({"response_mask": torch.tensor([[True, False, True]]), "loss_mask": mask}))


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=ragged_batches())
def test_entropy_of_every_layout_equals_per_sequence(model, batch):
    """The entropy of the (temperature-scaled) next-token distribution at each response token,
    from scratch one sequence at a time, and 0 at padding."""
    mask = batch["response_mask"]
    expected = torch.zeros(mask.shape)
    with torch.no_grad():
        for i in range(len(batch)):
            prompt = batch["prompt_ids"][i][batch["prompt_mask"][i]]
            response = batch["response_ids"][i][mask[i]]
            if not len(response):
                continue
            logits = model(input_ids=torch.cat([prompt, response])[None]).logits[0].float() / 0.7
            logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]
            expected[i, : len(response)] = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        for layout in LAYOUTS:
            _, got = response_logprobs(model, batch, 0.7, layout=layout, with_entropy=True)
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5, msg=layout)
    assert mask.sum() == 0 or expected[mask].min() > 0.1  # a real distribution, not a near-one-hot one


@pytest.mark.parametrize(
    "layout, attn, device, resolved",
    [
        ("auto", "flash_attention_2", "cuda", "packed"),
        ("auto", "flash_attention_3", "cuda", "packed"),
        ("auto", "rlpost_varlen", "cuda", "packed"),
        ("auto", "sdpa", "cpu", "shared_prompt"),
        ("auto", "eager", "cpu", "shared_prompt"),
        ("auto", "sdpa", "cuda", "padded"),
        ("packed", "sdpa", "cpu", "packed"),
        ("padded", "flash_attention_2", "cuda", "padded"),
        ("shared_prompt", "flash_attention_2", "cuda", "shared_prompt"),
    ],
)
def test_the_layout_rule(layout, attn, device, resolved):
    from rlpost.trainer.logprobs import resolve_layout

    assert resolve_layout(layout, attn, device) == resolved


def test_defaults_are_temperature_one_packed_and_no_entropy(model):
    """`response_logprobs(model, batch)`: the distribution at T = 1, the packed path, no entropy."""
    prompt_ids, prompt_mask = left_pad([[5, 6, 7], [8]], PAD)
    response_ids, response_mask = right_pad([[9, 10], [11, EOS, 12]], PAD)
    batch = Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
        }
    )
    with torch.no_grad():
        logp, entropy = response_logprobs(model, batch)
        assert entropy is None and response_logprobs(model, batch, 0.7, layout="padded")[1] is None
        assert torch.allclose(logp, reference_logprobs(model, batch, 1.0), atol=1e-5)
        assert not torch.allclose(logp, reference_logprobs(model, batch, 2.0), atol=1e-3)
        calls = []
        hook = model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(kwargs), with_kwargs=True)
        try:
            response_logprobs(model, batch)
        finally:
            hook.remove()
        assert calls[0]["input_ids"].shape == (1, 9)  # one packed row of the 9 real tokens
