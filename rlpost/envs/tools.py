"""Tools: plain Python functions with a JSON schema, the parsers that find a model's tool calls in
its text, and `ToolEnv`, the environment that runs them.

A tool's schema follows the OpenAI / Hugging Face chat-template `tools` convention
(`{"type": "function", "function": {"name", "description", "parameters"}}`), built from the
function's signature and docstring by `tool`. Parsers are registered by the format of the
model's chat template: `hermes` (Qwen2.5, Hermes: `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`) to start; `register_parser` adds others.
"""

from __future__ import annotations

import inspect
import json
import re
import threading
import typing
from dataclasses import dataclass
from typing import Any, Callable

from rlpost.envs.base import EnvStep, Turn

JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    schema: dict  # {"type": "function", "function": {...}}


def tool(fn: Callable | None = None, *, name: str | None = None):
    """Decorator: a function becomes a `Tool`. Its annotated parameters become the schema's
    properties (those without a default are required); the docstring's first line describes it."""

    def wrap(f: Callable) -> Tool:
        props, required = {}, []
        hints = typing.get_type_hints(f)
        for p in inspect.signature(f).parameters.values():
            kind = hints.get(p.name)
            if kind not in JSON_TYPES:
                raise TypeError(f"tool {f.__name__}: parameter {p.name!r} needs a JSON type annotation (int, str, ...)")
            props[p.name] = {"type": JSON_TYPES[kind]}
            if p.default is inspect.Parameter.empty:
                required.append(p.name)
        doc = (inspect.getdoc(f) or "").strip().splitlines()
        fn_schema = {
            "name": name or f.__name__,
            "description": doc[0] if doc else "",
            "parameters": {"type": "object", "properties": props, "required": required},
        }
        return Tool(fn_schema["name"], f, {"type": "function", "function": fn_schema})

    return wrap(fn) if fn is not None else wrap


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class Parsed:
    calls: list[ToolCall]
    errors: list[str]  # one message per call that could not be read


PARSERS: dict[str, Callable[[str], Parsed]] = {}


def register_parser(name: str):
    def wrap(fn):
        PARSERS[name] = fn
        return fn

    return wrap


HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@register_parser("hermes")
def parse_hermes(text: str) -> Parsed:
    """`<tool_call>{"name": "f", "arguments": {...}}</tool_call>`, as many as the turn holds
    (arguments may also come as a JSON string of an object, as some models write them)."""
    calls, errors = [], []
    for body in HERMES.findall(text):
        try:
            obj = json.loads(body)
            args = obj.get("arguments", {}) if isinstance(obj, dict) else None
            if isinstance(args, str):
                args = json.loads(args)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(args, dict):
                raise ValueError('expected {"name": <string>, "arguments": <object>}')
            calls.append(ToolCall(obj["name"], args))
        except ValueError as e:  # json.JSONDecodeError is one
            errors.append(f"could not read the tool call {body.strip()[:200]!r}: {e}")
    return Parsed(calls, errors)


def run_tool(t: Tool, arguments: dict, timeout_s: float) -> tuple[str, bool]:
    """(the result as text, whether it failed). The call runs in a thread and is given up after
    `timeout_s` (a tool that must be stopped for good belongs in a sandbox: `rlpost.envs.sandbox`)."""
    box: dict = {}

    def call():
        try:
            box["value"] = t.fn(**arguments)
        except Exception as e:  # the model's arguments or the tool itself: the model reads why
            box["error"] = f"{type(e).__name__}: {e}"

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return f"error: the tool {t.name} timed out after {timeout_s:g} s", True
    if "error" in box:
        return f"error: {box['error']}", True
    value = box["value"]
    return (value if isinstance(value, str) else json.dumps(value)), False


class ToolEnv:
    """An environment of tools: a turn with tool calls gets one `tool` message per call (the
    result, or the error); a turn without any ends the episode (it is the answer)."""

    def __init__(self, tools: list[Tool], parser: str = "hermes", timeout_s: float = 5.0):
        if parser not in PARSERS:
            raise KeyError(f"env.tool_parser={parser!r} is unknown; choose one of {sorted(PARSERS)}")
        self.tools, self.parse, self.timeout_s = tools, PARSERS[parser], timeout_s
        self.by_name = {t.name: t for t in tools}

    def step(self, turn: Turn) -> EnvStep:
        parsed = self.parse(turn.text)
        if not parsed.calls and not parsed.errors:
            return EnvStep(done=True)
        messages = [{"role": "tool", "content": f"error: {e}"} for e in parsed.errors]
        errors = len(parsed.errors)
        for call in parsed.calls:
            t = self.by_name.get(call.name)
            if t is None:
                content, failed = f"error: no tool named {call.name!r}; there are {sorted(self.by_name)}", True
            else:
                content, failed = run_tool(t, call.arguments, self.timeout_s)
            messages.append({"role": "tool", "content": content})
            errors += failed
        return EnvStep(messages=messages, tool_calls=len(parsed.calls) + len(parsed.errors), tool_errors=errors)
