"""Tools and their schemas, the hermes tool-call parser, the tool environment's answers (results,
each kind of error, timeouts) and the calculator's arithmetic and refusals."""

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlpost.config.schema import EnvConfig
from rlpost.envs import PARSERS, EpisodeRow, ToolCall, ToolEnv, Turn, make_env, tool
from rlpost.envs.calculator import calculator, evaluate
from rlpost.envs.retry import TRY_AGAIN
from rlpost.envs.tools import parse_hermes
from rlpost.rewards.executor import WorkerPool


def turn(text: str) -> Turn:
    return Turn(text, (), 0)


def test_a_schema_from_the_signature_and_docstring():
    @tool
    def lookup(city: str, days: int, metric: bool = True) -> str:
        """Weather for a city.

        More lines are not the description."""
        return f"{city}:{days}:{metric}"

    assert lookup.name == "lookup"
    assert lookup.schema == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
                "required": ["city", "days"],
            },
        },
    }
    with pytest.raises(TypeError, match="parameter 'x' needs a JSON type annotation"):
        tool(lambda x: x)


def test_hermes_finds_every_call_and_says_which_could_not_be_read():
    text = (
        'a <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call> b '
        '<tool_call>{"name": "g", "arguments": "{\\"y\\": [2]}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>'
    )
    parsed = parse_hermes(text)
    assert parsed.calls == [ToolCall("f", {"x": 1}), ToolCall("g", {"y": [2]})]
    assert len(parsed.errors) == 2
    assert "{not json}" in parsed.errors[0] and '"name": 3' in parsed.errors[1]
    assert parse_hermes("the answer is 4").calls == [] and PARSERS["hermes"] is parse_hermes


# Tools run in worker processes, which find them by module and name: they live at the top level.
@tool
def add(a: int, b: int) -> int:
    """a + b"""
    return a + b


@tool
def slow() -> str:
    """Sleeps."""
    time.sleep(60)
    return "late"


@tool
def broken() -> str:
    """Raises."""
    raise RuntimeError("disk on fire")


@tool
def pid() -> int:
    """The process it runs in."""
    return os.getpid()


def options(**kw) -> EnvConfig:
    return EnvConfig(**{"tool_timeout_s": 0.5, "workers": 2, "tool_memory_mb": 1024, **kw})


def calls(*bodies: str) -> Turn:
    return turn("".join(f"<tool_call>{b}</tool_call>" for b in bodies))


def call(name: str, **arguments) -> str:
    return json.dumps({"name": name, "arguments": arguments})


def test_the_tool_env_answers_each_call_and_ends_on_a_turn_without_one():
    env = ToolEnv([add, slow, broken], options(tool_timeout_s=0.2))
    start = time.monotonic()
    step = env.step(calls(call("add", a=2, b=3), call("nope"), call("add", a=2), call("broken"), call("slow"), "{oops"))
    assert time.monotonic() - start < 10  # the slow tool was given up on
    contents = [m["content"] for m in step.messages]
    assert all(m["role"] == "tool" for m in step.messages) and not step.done
    assert contents[0].startswith("error: could not read the tool call '{oops'")  # parse errors first
    assert contents[1] == "5"
    assert contents[2] == "error: no tool named 'nope'; there are ['add', 'broken', 'slow']"
    assert contents[3].startswith("error: TypeError") and "'b'" in contents[3]
    assert contents[4] == "error: RuntimeError: disk on fire"
    assert contents[5] == "error: the tool slow timed out after 0.2 s"
    assert (step.tool_calls, step.tool_errors) == (6, 5)
    end = env.step(turn("it is 5"))
    assert end.done and end.messages == [] and end.tool_calls == 0


def test_tools_run_in_the_worker_processes_of_the_reward_executor():
    env = ToolEnv([pid, add], options(workers=2))
    assert isinstance(env.pool, WorkerPool) and len(env.pool.procs) == 2  # env.workers processes
    assert ToolEnv([add, pid], options(workers=2)).pool is env.pool  # shared by environments of the same tools
    with ThreadPoolExecutor(4) as threads:  # env steps come from many threads at once
        pids = list(threads.map(lambda _: int(env.step(calls(call("pid"))).messages[0]["content"]), range(8)))
    assert os.getpid() not in pids and set(pids) <= {p.pid for p in env.pool.procs if p is not None}


MISBEHAVE = '''
import os, signal, time
from rlpost.envs import ToolEnv, tool

@tool
def misbehave(how: str) -> str:
    """Fails in the way it is told."""
    if how == "exit":
        os._exit(3)
    if how == "memory":
        return str(len(bytearray(10 * 2**30)))
    if how == "blocked":  # the alarm cannot reach it: the pool kills the worker
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        time.sleep(60)
    if how == "swallow":  # a bare except must not catch the timeout
        try:
            time.sleep(60)
        except Exception:
            return "swallowed"
    return "fine"

def make(row, options):
    return ToolEnv([misbehave], options)
'''


@pytest.mark.timeout(120)
def test_a_tool_that_crashes_hangs_or_overeats_is_answered_and_its_worker_replaced(tmp_path):
    (tmp_path / "misbehave.py").write_text(MISBEHAVE)  # a user's file: the worker runs it to find the tool
    spec, row = f"{tmp_path / 'misbehave.py'}:make", EpisodeRow("p", "1", "s")
    env = make_env(spec, row, options(workers=1, tool_memory_mb=512))
    step = env.step(calls(*(call("misbehave", how=h) for h in ("exit", "memory", "blocked", "swallow", "ok"))))
    assert [m["content"] for m in step.messages] == [
        "error: the tool misbehave crashed: the tool worker died (exit code 3)",
        "error: MemoryError (each worker process may use env.tool_memory_mb=512 MiB of address space: raise it, or 0 "
        "for no cap)",
        "error: the tool misbehave timed out after 0.5 s",
        "error: the tool misbehave timed out after 0.5 s",
        "fine",
    ]
    assert step.tool_errors == 4
    assert all(p.is_alive() for p in env.pool.procs)  # replaced


def test_a_tool_defined_inside_a_function_is_refused_with_its_name():
    @tool
    def local(x: int) -> int:
        """x"""
        return x

    with pytest.raises(TypeError, match="tool local: .* is not defined at the top level"):
        ToolEnv([local], options())


def test_an_unknown_parser_or_environment_names_the_key():
    with pytest.raises(KeyError, match="env.tool_parser='xml' is not a registered tool parser"):
        ToolEnv([calculator], options(tool_parser="xml"))
    with pytest.raises(KeyError, match="env.name='nope' is not a registered environment"):
        make_env("nope", EpisodeRow("p", "1", "s"), None)


@pytest.mark.parametrize(
    "expression, value",
    [("123*4567", 561741), ("2**10", 1024), ("7/2", 3.5), ("-(3+4)*2", -14), ("17//5", 3), ("17%5", 2), ("1.5*2", 3.0)],
)
def test_the_calculator_computes(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression, why",
    [
        ("__import__('os')", "is not allowed"),
        ("abs(-1)", "is not allowed"),
        ("x+1", "is not allowed"),
        ("10**10**10", "too large"),
        ("9" * 60 + "*" + "9" * 60, "more than 100 digits"),
        ("1/0", "division by zero"),
        ("1+", "not an arithmetic expression"),
        ("1" * 1001, "longer than 1000"),
    ],
)
def test_the_calculator_refuses(expression, why):
    with pytest.raises(ValueError, match=why):
        evaluate(expression)


def test_the_calculator_environment_and_its_tool():
    env = make_env("calculator", EpisodeRow("123*4567=", "561741", "multiply"), options())
    assert [t.schema["function"]["name"] for t in env.tools] == ["calculator"]
    step = env.step(turn('<tool_call>{"name": "calculator", "arguments": {"expression": "123*4567"}}</tool_call>'))
    assert step.messages == [{"role": "tool", "content": "561741"}] and step.tool_errors == 0
    bad = env.step(turn('<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'))
    assert bad.messages == [{"role": "tool", "content": "error: ValueError: division by zero"}] and bad.tool_errors == 1
    assert calculator.fn(expression="6/3") == "2"  # a whole float is written as an integer


def test_retry_says_try_again_until_the_answer_is_right():
    env = make_env("retry", EpisodeRow("1+2=", "3", "arithmetic"), None)
    assert env.step(turn("4")).messages == [{"role": "user", "content": TRY_AGAIN}]
    assert env.step(turn(" 3 ")).done


USER_ENV = '''
import re
from rlpost.envs import PARSERS, ToolCall, ToolEnv, tool
from rlpost.envs.tools import Parsed

@tool
def double(x: int) -> int:
    """Twice x."""
    return 2 * x

@PARSERS.register("bracket")
def bracket(text):
    return Parsed([ToolCall(n, {"x": int(a)}) for n, a in re.findall(r"\\[(\\w+) (\\d+)\\]", text)], [])

def make(row, options):
    return ToolEnv([double], options)
'''


def test_an_environment_from_a_users_file_with_its_own_parser(tmp_path):
    from rlpost.config import load_config

    (tmp_path / "myenv.py").write_text(USER_ENV)
    spec = f"{tmp_path / 'myenv.py'}:make"
    cfg = load_config(["+recipe=quickstart", f"env.name={spec}", "env.tool_parser=bracket"])  # checked later
    env = make_env(spec, EpisodeRow("p", "1", "s"), cfg.env)
    assert env.step(turn("[double 21]")).messages == [{"role": "tool", "content": "42"}]
    with pytest.raises(AttributeError, match="defines no function 'nope'"):
        make_env(f"{tmp_path / 'myenv.py'}:nope", EpisodeRow("p", "1", "s"), cfg.env)


def test_a_chat_prompt_advertises_the_tools_of_its_environment(tmp_path):
    from rlpost.config import load_config
    from rlpost.controller.setup import env_tools
    from rlpost.data.dataset import load_prompts
    from rlpost.tiny.model import TOOL_CHARS, build_char_tokenizer

    tokenizer = build_char_tokenizer(extra_chars=TOOL_CHARS)
    tokenizer.chat_template = (  # a template that lists the tools first, as Qwen's does
        "{% if tools %}tools: {{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant: "
    )
    rows = [
        {"prompt": [{"role": "user", "content": "12*34="}], "ground_truth": "408"},
        {"prompt": "5*6=", "ground_truth": "30"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def texts(*overrides):
        cfg = load_config(["+recipe=quickstart", *overrides])
        return [r.prompt_text for r in load_prompts([str(path)], tokenizer, 2048, "multiply", env_tools(cfg)).rows]

    chat, plain = texts("env.name=calculator")
    assert chat == f"tools: {json.dumps([calculator.schema])}\nuser: 12*34=\nassistant: "
    assert plain == "5*6="  # a string prompt is used as it is: it teaches its own call format
    assert texts() == ["user: 12*34=\nassistant: ", "5*6="]  # single-turn: no tools
