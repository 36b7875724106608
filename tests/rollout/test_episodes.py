"""Multi-turn episodes, token in, token out: the model's tokens go into the trajectory and into
the next turn's context exactly as sampled, the environment's answers are rendered through the
chat template and get no loss and no log-prob, and every limit (turns, token budget, time) ends
an episode where it should."""

import pytest
import torch

from rlpost.data.padding import check_masks
from rlpost.envs import EnvStep, Turn
from rlpost.rollout.base import SamplingParams
from rlpost.rollout.episodes import render_suffix, run_episodes
from tests.rollout.scripted import EOS, TOK, UNK, ScriptedEngine, ScriptedEnv, ids, suffix


def test_the_suffix_is_what_the_template_puts_after_a_model_turn():
    assert TOK.decode(suffix(0)) == "\ntool: R0\nassistant: "  # the tiny template writes no EOS itself

    class QwenLike:  # a template that writes the EOS after each turn (Qwen's <|im_end|>)
        eos_token = "<|im_end|>"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            out = ""
            for m in messages:
                if m["role"] == "tool":
                    out += f"<|im_start|>user\n<tool_response>\n{m['content']}\n</tool_response><|im_end|>\n"
                else:
                    out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
            return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")

        def __call__(self, text, add_special_tokens):
            class Out:
                input_ids = [ord(c) for c in text]

            return Out()

    got = "".join(map(chr, render_suffix(QwenLike(), [{"role": "tool", "content": "42"}])))
    assert got == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_token_in_token_out_with_loss_only_on_the_model_tokens():
    # turn 1 holds <unk>, which decoding drops: re-tokenizing the text would lose it
    turn1, turn2, turn3 = ids("ab") + [UNK] + [EOS], ids("c") + [EOS], ids("done") + [EOS]
    engine = ScriptedEngine({"P1=": [turn1, turn2, turn3], "Q=": [ids("done") + [EOS]]})
    envs = [ScriptedEnv(), ScriptedEnv()]
    prompts = [ids("P1="), ids("Q=")]
    batch = run_episodes(engine, TOK, prompts, envs, SamplingParams(n=1, max_tokens=64, seed=5), 4, 60.0)
    check_masks(batch)

    want = turn1 + suffix(0) + turn2 + suffix(1) + turn3
    n = len(want)
    assert batch["response_ids"][0, :n].tolist() == want
    assert batch["response_mask"][0].tolist() == [True] * n + [False] * (batch["response_ids"].shape[1] - n)
    model = [True] * len(turn1) + [False] * len(suffix(0)) + [True] * len(turn2) + [False] * len(suffix(1))
    model += [True] * len(turn3)
    assert batch["loss_mask"][0, :n].tolist() == model and not batch["loss_mask"][0, n:].any()
    expected_lp = torch.tensor(want, dtype=torch.float32) / -100 * torch.tensor(model)
    assert torch.equal(batch["rollout_logprobs"][0, :n], expected_lp)
    assert batch["last_turn_start"].tolist() == [n - len(turn3), 0]
    assert batch["env_turns"].tolist() == [3, 1] and batch["env_tool_calls"].tolist() == [2, 0]
    assert batch["env_tool_errors"].tolist() == [2, 0]  # summed over the turns, as the calls are
    assert batch["env_reward"].tolist() == [2.0, 1.0] and batch["weight_version"].tolist() == [7, 7]
    assert batch["prompt_ids"].tolist() == [prompts[0], [TOK.pad_token_id] + prompts[1]]  # left-padded
    # each round's contexts: the prompt and everything so far, as tokens; the turns the env saw
    contexts = [c for contexts, _ in engine.calls for c in contexts]
    assert contexts == [prompts[0], prompts[1], prompts[0] + turn1 + suffix(0), prompts[0] + want[: -len(turn3)]]
    assert [t.token_ids for t in envs[0].seen] == [tuple(turn1), tuple(turn2), tuple(turn3)]
    assert envs[0].seen[0].text == "ab" and [t.index for t in envs[0].seen] == [0, 1, 2]
    assert [p.seed for _, p in engine.calls] == [5, 5 + 7919, 5 + 2 * 7919] and all(p.n == 1 for _, p in engine.calls)


def test_each_limit_ends_the_episode():
    forever = [ids("x") + [EOS]] * 10
    engine = ScriptedEngine({"A=": forever})
    params = SamplingParams(n=1, max_tokens=200)
    turns = run_episodes(engine, TOK, [ids("A=")], [ScriptedEnv()], params, 3, 60.0)
    assert turns["env_turns"].tolist() == [3] and turns["env_timeouts"].tolist() == [0]
    timed = run_episodes(engine, TOK, [ids("A=")], [ScriptedEnv()], params, 3, 0.0)
    assert timed["env_turns"].tolist() == [1] and timed["env_timeouts"].tolist() == [1]
    # the budget: turn 1 (2 tokens) and its suffix fit in 20, turn 2 is cut at the budget
    budget = 2 + len(suffix(0)) + 1
    cut = run_episodes(engine, TOK, [ids("A=")], [ScriptedEnv()], SamplingParams(n=1, max_tokens=budget), 9, 60.0)
    assert cut["response_mask"].sum().item() == budget and cut["env_turns"].tolist() == [2]
    assert cut["response_ids"][0, budget - 1].item() == ids("x")[0]  # no EOS: truncated
    # a suffix that leaves no room for a model token ends the episode before it
    tight = run_episodes(engine, TOK, [ids("A=")], [ScriptedEnv()], SamplingParams(n=1, max_tokens=budget - 1), 9, 60.0)
    assert tight["response_mask"].sum().item() == 2 and tight["env_turns"].tolist() == [1]


def test_episodes_of_one_round_are_each_cut_at_their_own_budget():
    """Two episodes whose first turns differ in length share the second round, which asks the engine
    for the larger of their budgets left: rlpost cuts each to its own, so no response passes
    `max_tokens` (the engine above cuts at what it is asked, which one episode alone never tells)."""
    engine = ScriptedEngine(
        {"A=": [ids("x") + [EOS]] * 10, "B=": [ids("yyy") + [EOS]] + [ids("zzzzzzzzzz") + [EOS]] * 9}
    )
    budget = 4 + len(suffix(0)) + 3
    params = SamplingParams(n=1, max_tokens=budget)
    out = run_episodes(engine, TOK, [ids("A="), ids("B=")], [ScriptedEnv(), ScriptedEnv()], params, 9, 60.0)
    # A: 2 + suffix + 2 tokens, then no room for another suffix; B: 4 + suffix + its second turn cut to 3
    assert out["response_mask"].sum(-1).tolist() == [budget - 3, budget]
    assert engine.calls[1][1].max_tokens == 5  # round 2 asks for A's 5 left, where B has 3


def test_n_episodes_per_prompt_in_generate_order():
    engine = ScriptedEngine({"A=": [ids("done") + [EOS]], "B=": [ids("a") + [EOS], ids("done") + [EOS]]})
    envs = [ScriptedEnv() for _ in range(4)]
    batch = run_episodes(engine, TOK, [ids("A="), ids("B=")], envs, SamplingParams(n=2, max_tokens=64), 4, 60.0)
    assert batch["env_turns"].tolist() == [1, 1, 2, 2]
    with pytest.raises(ValueError, match="3 environments for 2 prompts x 2 episodes"):
        run_episodes(engine, TOK, [ids("A="), ids("B=")], envs[:3], SamplingParams(n=2), 4, 60.0)


class ContinuousEngine(ScriptedEngine):
    """A continuous-batching engine (as vLLM's `turns`): each `step` finishes the oldest turn in
    flight, and the log of turn starts shows what ran while an environment was busy."""

    def turns(self, params):
        engine = self

        class Turns:
            continuous = True

            def __init__(self):
                self.queue = []

            def add(self, key, context, max_tokens):
                engine.started.append((key, context.count(EOS)))
                self.queue.append((key, context))

            def busy(self):
                return bool(self.queue)

            def step(self):
                key, context = self.queue.pop(0)
                turn = engine.generate([context], params)["response_ids"][0].tolist()
                return [(key, turn, [0.0] * len(turn))]

        self.started = []
        return Turns()


class GatedEnv(ScriptedEnv):
    """Its second step waits (up to 10 s) until `gate` opens."""

    def __init__(self, gate):
        self.gate, self.waited = gate, None

    def step(self, turn):
        if turn.index == 1:
            self.waited = self.gate.wait(10)
        return super().step(turn)


class OpeningEnv(ScriptedEnv):
    def __init__(self, gate):
        self.gate = gate

    def step(self, turn):
        if turn.text == "done":
            self.gate.set()
        return super().step(turn)


def test_a_slow_tool_holds_back_only_its_own_episode_on_a_continuous_engine():
    """Episode 0's second tool call waits for episode 1 to finish all its turns: a runner that
    held the engine back for episode 0's tool would never let episode 1 finish (the wait times out)."""
    import threading

    gate = threading.Event()
    slow, quick = [ids("a") + [EOS], ids("b") + [EOS], ids("done") + [EOS]], [ids("c") + [EOS]] * 3
    engine = ContinuousEngine({"A=": slow, "B=": quick + [ids("done") + [EOS]]})
    envs = [GatedEnv(gate), OpeningEnv(gate)]
    batch = run_episodes(engine, TOK, [ids("A="), ids("B=")], envs, SamplingParams(n=1, max_tokens=200), 9, 60.0)
    assert envs[0].waited is True
    assert batch["env_turns"].tolist() == [3, 4]
    # episode 1 took its turns 2..4 while episode 0's tool was still running
    assert engine.started.index((1, 3)) < engine.started.index((0, 2))
    # the tokens are the same as on the round-by-round engine
    gate.set()
    rounds = run_episodes(
        ScriptedEngine(engine.scripts),
        TOK,
        [ids("A="), ids("B=")],
        [GatedEnv(gate), OpeningEnv(gate)],
        SamplingParams(n=1, max_tokens=200),
        9,
        60.0,
    )
    assert torch.equal(rounds["response_ids"], batch["response_ids"]) and torch.equal(
        rounds["loss_mask"], batch["loss_mask"]
    )


def test_environment_steps_run_at_once():
    """8 episodes whose tool calls each wait for all 8 to be running (a barrier): run one after
    another they would time out (BrokenBarrierError)."""
    import threading

    barrier = threading.Barrier(8, timeout=10)

    class BarrierEnv(ScriptedEnv):
        def step(self, turn):
            if turn.index == 0:
                barrier.wait()
            return super().step(turn)

    engine = ScriptedEngine({"A=": [ids("a") + [EOS], ids("done") + [EOS]]})
    envs = [BarrierEnv() for _ in range(8)]
    batch = run_episodes(engine, TOK, [ids("A=")], envs, SamplingParams(n=8, max_tokens=64), 4, 60.0, env_workers=8)
    assert batch["env_turns"].tolist() == [2] * 8 and len(engine.calls) == 2  # one generate per round


class RaisingEnv(ScriptedEnv):
    """The user's environment whose step raises from its second turn on."""

    def step(self, turn: Turn) -> EnvStep:
        if turn.index >= 1:
            raise KeyError("feedback")
        return super().step(turn)


class ExitingEnv(ScriptedEnv):
    """The user's environment whose step calls sys.exit (the eleventh catalogue's t35: only
    Exception was caught, and SystemExit killed the rollout actor)."""

    def step(self, turn: Turn) -> EnvStep:
        if turn.index >= 1:
            raise SystemExit(3)
        return super().step(turn)


class InterruptingEnv(ScriptedEnv):
    """The user's environment whose step raises KeyboardInterrupt (the twelfth catalogue's t147: the
    rollout actor died, said as a cancelled Ray task, with neither the exception nor env.name named)."""

    def step(self, turn: Turn) -> EnvStep:
        if turn.index >= 1:
            raise KeyboardInterrupt
        return super().step(turn)


class NoneEnv(ScriptedEnv):
    """The user's environment whose step returns None from its second turn on (the eighth catalogue's
    e46: the episode ended without a word, env/errors 0)."""

    def step(self, turn: Turn) -> EnvStep:
        return None if turn.index >= 1 else super().step(turn)


class OddRewardEnv(ScriptedEnv):
    """The user's environment whose second step's reward is `odd` (the ninth catalogue's n49: a
    string killed the rollout actor; n48: a NaN skipped the update, blamed on the rewards' size)."""

    odd: object = "1.0"

    def step(self, turn: Turn) -> EnvStep:
        out = super().step(turn)
        return EnvStep(out.messages, self.odd, out.done) if turn.index >= 1 else out


class NanRewardEnv(OddRewardEnv):
    odd = float("nan")


class StringMessageEnv(ScriptedEnv):
    """The user's environment whose second step's message is a string (the tenth catalogue's t37: a
    TypeError killed the rollout actor, reported as a worker that died, with resume advice)."""

    def step(self, turn: Turn) -> EnvStep:
        out = super().step(turn)
        return EnvStep(["No, try again."], out.reward, out.done) if turn.index >= 1 else out


class NoContentEnv(ScriptedEnv):
    """Its second step's tool message has `content: None` (cat21's t128b: an empty tool turn, no error)."""

    def step(self, turn: Turn) -> EnvStep:
        out = super().step(turn)
        return EnvStep([{"role": "tool", "content": None}], out.reward, out.done) if turn.index >= 1 else out


class StringDoneEnv(ScriptedEnv):
    """The user's environment whose second step says done="no" (the eleventh catalogue's t33: a
    truthy string ended every episode at that turn and dropped its message, with nothing said)."""

    def step(self, turn: Turn) -> EnvStep:
        out = super().step(turn)
        return EnvStep(out.messages, out.reward, "no") if turn.index >= 1 else out


@pytest.mark.parametrize(
    "env, said",
    [
        (RaisingEnv, "raised KeyError('feedback')"),
        (StringDoneEnv, "returned done='no' (str), not True or False"),
        (ExitingEnv, "raised SystemExit(3)"),
        (InterruptingEnv, "raised KeyboardInterrupt()"),
        (NoneEnv, "returned None (NoneType), not an EnvStep"),  # it ended without a word, env/errors 0
        (OddRewardEnv, "returned a reward of '1.0' (str), not a finite number"),
        (NanRewardEnv, "returned a reward of nan (float), not a finite number"),
        (
            StringMessageEnv,
            "returned a message 'No, try again.' (str); each of EnvStep.messages is a dict "
            "{'role': ..., 'content': ...} whose content is text (or a list of parts)",
        ),
        (
            NoContentEnv,
            "returned a message {'role': 'tool', 'content': None} (dict); each of EnvStep.messages is a dict "
            "{'role': ..., 'content': ...} whose content is text (or a list of parts)",
        ),
    ],
)
def test_an_environment_that_fails_ends_its_episode_counted_and_the_others_go_on(capsys, env, said):
    forever = [ids("x") + [EOS]] * 10
    engine = ScriptedEngine({"A=": forever, "B=": forever})
    params = SamplingParams(n=1, max_tokens=200)
    batch = run_episodes(engine, TOK, [ids("A="), ids("B=")], [env(), ScriptedEnv()], params, 4, 60.0)
    assert batch["env_errors"].tolist() == [1, 0] and batch["env_turns"].tolist() == [2, 4]
    assert batch["env_reward"].tolist() == [0.5, 2.0]  # what its steps scored before the one that failed
    assert capsys.readouterr().out == f"warning: env.step {said} in an episode: it ends there (env/errors counts)\n"


def test_an_environment_its_factory_could_not_make_ends_its_episode_said(capsys):
    """The eleventh catalogue's t38 (TRACEBACK): a factory that raised for a later row killed the
    rollout actor, reported as "a Ray worker or node of the run died" with resume advice; its error
    was shown nowhere."""
    from types import SimpleNamespace

    from rlpost.envs import ENVS, EpisodeRow
    from rlpost.rollout.base import SamplingParams
    from rlpost.rollout.episodes import Unmade, run_episodes
    from rlpost.rollout.worker import made_env

    def factory(row, options):
        if row.ground_truth == "bad":
            raise RuntimeError("no env for bad")
        return ScriptedEnv()

    ENVS.register("cat11_t38", factory)
    options = SimpleNamespace(name="cat11_t38")
    envs = [made_env(options, EpisodeRow("A=", truth, "arithmetic")) for truth in ("bad", "good")]
    assert isinstance(envs[0], Unmade) and isinstance(envs[1], ScriptedEnv)
    forever = [ids("x") + [EOS]] * 10
    engine = ScriptedEngine({"A=": forever, "B=": forever})
    batch = run_episodes(engine, TOK, [ids("A="), ids("B=")], envs, SamplingParams(n=1, max_tokens=200), 4, 60.0)
    assert batch["env_errors"].tolist() == [1, 0] and batch["env_turns"].tolist() == [1, 4]
    out = capsys.readouterr().out
    assert "env.name's factory raised RuntimeError('no env for bad') for this episode's row" in out


def test_slow_factories_are_made_side_by_side_and_those_past_the_episode_time_end_their_episode():
    """The twelfth catalogue's t182: a factory that took 3 s ran once per episode, one after another
    (93 s of generation at env.workers=16), past env.timeout_s=1 and with nothing said."""
    import threading
    import time
    from types import SimpleNamespace

    from rlpost.envs import ENVS, EpisodeRow
    from rlpost.rollout.episodes import Unmade
    from rlpost.rollout.worker import made_envs

    lock, running, most = threading.Lock(), [0], [0]

    def factory(row, options):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.3 if row.ground_truth == "slow" else 0.0)
        with lock:
            running[0] -= 1
        return ScriptedEnv()

    ENVS.register("cat12_t182", factory)
    rows = [EpisodeRow("A=", truth, "arithmetic") for truth in ("slow", "slow", "fast")]
    envs = made_envs(SimpleNamespace(name="cat12_t182", workers=8, timeout_s=5.0), rows, 2)
    assert len(envs) == 6 and all(isinstance(env, ScriptedEnv) for env in envs)
    assert most[0] >= 4  # the four slow ones at once (one after another: 1)
    envs = made_envs(SimpleNamespace(name="cat12_t182", workers=8, timeout_s=0.1), rows, 2)
    assert [type(env).__name__ for env in envs] == ["Unmade"] * 4 + ["ScriptedEnv"] * 2
    assert "not made within env.timeout_s=0.1 s, an episode's time" in str(envs[0].error)
    assert isinstance(envs[0], Unmade)
