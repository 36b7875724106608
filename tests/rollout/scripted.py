"""Test doubles of multi-turn episodes (tests/rollout/test_episodes.py): an engine that answers
from a script, an environment that answers each turn with a tool result."""

from rlpost.data.batch import Batch
from rlpost.data.padding import right_pad
from rlpost.envs import EnvStep, Turn
from rlpost.rollout.episodes import render_suffix
from rlpost.tiny.model import build_char_tokenizer

TOK = build_char_tokenizer()
EOS, UNK = TOK.eos_token_id, TOK.unk_token_id


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False).input_ids


class ScriptedEngine:
    """Answers each context with the next turn of its prompt's script (the turn number is the
    number of EOS tokens in the context); a token's log-prob is -(its id) / 100."""

    weight_version = 7

    def __init__(self, scripts: dict[str, list[list[int]]]):
        self.scripts, self.calls = scripts, []

    def generate(self, prompts, params):
        self.calls.append(([list(p) for p in prompts], params))
        outs = []
        for context in prompts:
            prompt = TOK.decode(context).split("=")[0] + "="  # the scripts' prompts end with "="
            turn = self.scripts[prompt][context.count(EOS)]
            outs.append(turn[: params.max_tokens])
        response_ids, mask = right_pad(outs, TOK.pad_token_id)
        return Batch({"response_ids": response_ids, "response_mask": mask, "rollout_logprobs": -response_ids / 100.0})


class ScriptedEnv:
    """Answers `R<turn>` as a tool result with reward 0.5 (one tool call, which erred), ends on a
    turn that says `done`."""

    tools = []

    def step(self, turn: Turn) -> EnvStep:
        self.seen = getattr(self, "seen", []) + [turn]
        if turn.text == "done":
            return EnvStep(done=True, reward=1.0)
        return EnvStep(
            messages=[{"role": "tool", "content": f"R{turn.index}"}], reward=0.5, tool_calls=1, tool_errors=1
        )


def suffix(index: int) -> list[int]:
    return render_suffix(TOK, [{"role": "tool", "content": f"R{index}"}])
