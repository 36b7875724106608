"""The tiny model's warm-up data: the multiply task, the teacher's calculator episodes (exactly
what an episode of the `calculator` environment holds, token for token), and the warm-up's
length groups (the same gradient as one padded batch)."""

import random

import torch

from rlpost.config.schema import EnvConfig
from rlpost.data.batch import Batch
from rlpost.data.padding import right_pad
from rlpost.data.tasks import multiply_split, operands
from rlpost.envs import EpisodeRow, make_env
from rlpost.rollout.base import SamplingParams
from rlpost.rollout.episodes import run_episodes
from rlpost.tiny.model import TOOL_CHARS, build_char_tokenizer, tiny_qwen2_config
from rlpost.tiny.warmup import answer_example, by_length, calculator_trace, sft_batch

TOK = build_char_tokenizer(extra_chars=TOOL_CHARS)


def test_multiply_split_is_disjoint_and_right():
    train, val = multiply_split(2, seed=0, num_val=40)
    assert len(train) + len(val) == 90 * 90 and not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    for row in val:
        a, b = operands(row)
        assert row["prompt"] == f"{a}*{b}=" and row["ground_truth"] == str(a * b)
        assert row["data_source"] == "arithmetic"  # exact match of the last answer


def test_the_tool_chars_are_added_after_the_arithmetic_vocabulary():
    plain = build_char_tokenizer()
    assert TOK.get_vocab() == {**plain.get_vocab(), **{c: len(plain) + i for i, c in enumerate(TOOL_CHARS)}}
    assert TOK.decode(TOK('{"a": [1]}', add_special_tokens=False).input_ids) == '{"a": [1]}'


class Teacher:
    """Plays the trained segments of a teacher's episode as the model's turns."""

    weight_version = 0

    def __init__(self, script):
        self.script = script

    def generate(self, prompts, params):
        turn = self.script.pop(0)
        ids, mask = right_pad([turn], TOK.pad_token_id)
        return Batch({"response_ids": ids, "response_mask": mask, "rollout_logprobs": torch.zeros(ids.shape)})


def test_a_calculator_trace_is_the_episode_the_environment_makes():
    row = {"prompt": "347*281=", "ground_truth": str(347 * 281), "data_source": "arithmetic"}
    trace = calculator_trace(TOK, row, random.Random(0), tool_share=1.0)
    assert [on for _, on in trace] == [False, True, False, True]
    assert TOK.decode(trace[1][0], skip_special_tokens=True) == (
        '<tool_call>{"name":"calculator","arguments":{"expression":"347*281"}}</tool_call>'
    )
    env = make_env("calculator", EpisodeRow(row["prompt"], row["ground_truth"], "arithmetic"), EnvConfig())
    model_turns = [ids for ids, on in trace if on]
    batch = run_episodes(Teacher(model_turns), TOK, [trace[0][0]], [env], SamplingParams(max_tokens=200), 3, 60.0)
    n = int(batch["response_mask"].sum())
    assert batch["response_ids"][0, :n].tolist() == [t for ids, _ in trace[1:] for t in ids]
    assert batch["loss_mask"][0, :n].tolist() == [on for ids, on in trace[1:] for _ in ids]
    assert batch["env_tool_calls"].tolist() == [1] and batch["env_tool_errors"].tolist() == [0]
    answer = batch["response_ids"][0, batch["last_turn_start"][0] : n]
    assert TOK.decode(answer, skip_special_tokens=True) == row["ground_truth"]


def test_the_teacher_calls_at_its_rate_and_guesses_wrong_otherwise():
    rng = random.Random(1)
    row = {"prompt": "999*999=", "ground_truth": str(999 * 999), "data_source": "arithmetic"}
    traces = [calculator_trace(TOK, row, rng, tool_share=0.3) for _ in range(2000)]
    calls = [t for t in traces if len(t) == 4]
    assert 0.27 < len(calls) / len(traces) < 0.33
    guesses = [int(TOK.decode(t[1][0], skip_special_tokens=True)) for t in traces if len(t) == 2]
    assert all(g != 999 * 999 and abs(g - 999 * 999) <= 999 for g in guesses)
    assert min(guesses) < 999 * 999 < max(guesses)


def test_a_warm_up_step_in_length_groups_is_the_step_of_one_padded_batch():
    """One step of `warm_up` (long episodes and short answers: two groups) against AdamW on the
    mean loss of the whole batch padded to its longest example, written out here."""
    import copy

    from transformers import Qwen2ForCausalLM

    from rlpost.tiny.warmup import warm_up

    torch.manual_seed(0)
    cfg = tiny_qwen2_config(len(TOK), 32, 2, 2, 1, 64, 160, TOK.pad_token_id, TOK.eos_token_id)
    model = Qwen2ForCausalLM(cfg)
    rows = multiply_split(3, seed=0, num_val=8)[1]
    rng = random.Random(2)
    examples = {r["prompt"]: calculator_trace(TOK, r, rng, 0.5) for r in rows}
    examples[rows[0]["prompt"]] = answer_example(TOK, rows[0])
    assert len(by_length(list(examples.values()))) == 2

    reference = copy.deepcopy(model)
    ids, mask, labels = sft_batch(list(examples.values()), TOK.pad_token_id)
    reference(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.0).step()

    warm_up(model, TOK, rows, 1, len(rows), 1e-2, 0, lambda row, rng: examples[row["prompt"]], log=lambda *_: None)
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=name)  # of steps of 1e-2
