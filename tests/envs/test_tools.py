"""Tools and their schemas, the hermes tool-call parser, the tool environment's answers (results,
each kind of error, timeouts) and the calculator's arithmetic and refusals."""

import time

import pytest

from rlpost.envs import PARSERS, EpisodeRow, ToolCall, ToolEnv, Turn, make_env, tool
from rlpost.envs.calculator import calculator, evaluate
from rlpost.envs.retry import TRY_AGAIN
from rlpost.envs.tools import parse_hermes


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


def test_the_tool_env_answers_each_call_and_ends_on_a_turn_without_one():
    @tool
    def add(a: int, b: int) -> int:
        """a + b"""
        return a + b

    @tool
    def slow() -> str:
        """Sleeps."""
        time.sleep(5)
        return "late"

    @tool
    def broken() -> str:
        """Raises."""
        raise RuntimeError("disk on fire")

    env = ToolEnv([add, slow, broken], timeout_s=0.2)
    calls = "".join(
        f"<tool_call>{c}</tool_call>"
        for c in [
            '{"name": "add", "arguments": {"a": 2, "b": 3}}',
            '{"name": "nope", "arguments": {}}',
            '{"name": "add", "arguments": {"a": 2}}',
            '{"name": "broken", "arguments": {}}',
            '{"name": "slow", "arguments": {}}',
            "{oops",
        ]
    )
    start = time.monotonic()
    step = env.step(turn(calls))
    assert time.monotonic() - start < 2  # the slow tool was given up on
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


def test_an_unknown_parser_or_environment_names_the_key():
    with pytest.raises(KeyError, match="env.tool_parser='xml' is unknown"):
        ToolEnv([calculator], parser="xml")
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
    class Options:
        tool_parser, tool_timeout_s = "hermes", 1.0

    env = make_env("calculator", EpisodeRow("123*4567=", "561741", "multiply"), Options())
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
from rlpost.envs import ToolCall, ToolEnv, register_parser, tool
from rlpost.envs.tools import Parsed

@tool
def double(x: int) -> int:
    """Twice x."""
    return 2 * x

@register_parser("bracket")
def bracket(text):
    return Parsed([ToolCall(n, {"x": int(a)}) for n, a in re.findall(r"\\[(\\w+) (\\d+)\\]", text)], [])

def make(row, options):
    return ToolEnv([double], options.tool_parser, options.tool_timeout_s)
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
