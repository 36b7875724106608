"""Tools: plain Python functions with a JSON schema, the parsers that find a model's tool calls in
its text, and `ToolEnv`, the environment that runs them.

A tool's schema follows the OpenAI / Hugging Face chat-template `tools` convention
(`{"type": "function", "function": {"name", "description", "parameters"}}`), built from the
function's signature and docstring by `tool`. Parsers are registered by the format of the
model's chat template: `hermes` (Qwen2.5, Hermes: `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`) to start; `PARSERS.register` adds others.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import inspect
import json
import re
import sys
import threading
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlpost.data.userfile import run_file
from rlpost.envs.base import EnvStep, Turn
from rlpost.registry import Registry
from rlpost.rewards.executor import WorkerPool

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


# `@PARSERS.register(name)` over a function `(text) -> Parsed` makes it `env.tool_parser=<name>`
# (replacing a parser of that name: a user's file that registers one may run more than once)
PARSERS: Registry[Callable[[str], Parsed]] = Registry("tool parser", key="env.tool_parser", replace=True)


HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@PARSERS.register("hermes")
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


def tool_reference(t: Tool) -> tuple[str, str | None, str]:
    """(module, file, qualified name) of a tool's function: how a tool worker finds it. A tool
    runs in a worker process, so it must be defined at the top level of a module or a file."""
    fn = t.fn
    module = sys.modules.get(fn.__module__)
    if module is None or "<locals>" in fn.__qualname__:
        raise TypeError(
            f"tool {t.name}: {fn!r} is not defined at the top level of a module or a file; tools run in "
            "worker processes, which find them by name"
        )
    return fn.__module__, getattr(module, "__file__", None), fn.__qualname__


def _find_function(module_name: str, path: str | None, qualname: str) -> Callable:
    """In a tool worker: the module by name when it imports (a script's `__main__` does not), else
    the file run under that name."""
    module = sys.modules.get(module_name)
    if module is None and module_name != "__main__":
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            pass
    if module is None or module_name == "__main__":
        if path is None:
            raise ImportError(f"cannot find the module {module_name!r} of a tool")
        module = run_file(path, f"rlpost_tools_{Path(path).stem}")
    obj = functools.reduce(getattr, qualname.split("."), module)
    return obj.fn if isinstance(obj, Tool) else obj


def _tool_caller(references: dict[str, tuple]) -> Callable[[tuple[str, dict]], str]:
    """The tool pool's function, built in the worker: (tool name, arguments) -> the result as text."""
    fns = {name: _find_function(*ref) for name, ref in references.items()}

    def call(item: tuple[str, dict]) -> str:
        name, arguments = item
        value = fns[name](**arguments)
        return value if isinstance(value, str) else json.dumps(value)

    return call


_POOLS: dict[tuple, WorkerPool] = {}  # one per set of tools and limits, in this process
_POOLS_LOCK = threading.Lock()


@atexit.register  # before multiprocessing's own exit handler, which would wait for the workers
def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()


def tool_pool(tools: list[Tool], workers: int, memory_mb: int) -> WorkerPool:
    """The worker processes that run these tools (shared by every environment of this process that
    has the same tools): the reward executor's pool, with a timeout per call and a memory cap."""
    references = {t.name: tool_reference(t) for t in tools}
    key = (tuple(sorted(references.items())), workers, memory_mb)
    with _POOLS_LOCK:
        if key not in _POOLS:
            setup = functools.partial(_tool_caller, references)
            _POOLS[key] = WorkerPool(setup, workers, memory_mb, "tool", "env.tool_timeout_s")
        return _POOLS[key]


class ToolEnv:
    """An environment of tools: a turn with tool calls gets one `tool` message per call (the
    result, or the error); a turn without any ends the episode (it is the answer).

    `options` is the run's `env` config section: `tool_parser` reads the calls; each runs in a
    worker process (`env.workers` of them, `env.tool_memory_mb` each) for at most
    `env.tool_timeout_s`; a tool that raises, hangs or kills its worker is answered with
    `error: ...`, which the model reads."""

    def __init__(self, tools: list[Tool], options):
        for t in tools:  # (a plain function was "'function' object has no attribute 'name'": the seventeenth's t122)
            if not isinstance(t, Tool):
                name = getattr(t, "__name__", repr(t))
                raise TypeError(
                    f"ToolEnv's tools are made with @tool (from rlpost.envs import tool): {name} is a "
                    f"{type(t).__name__}, not a Tool: put @tool above its def"
                )
        self.tools, self.parse, self.timeout_s = tools, PARSERS.get(options.tool_parser), options.tool_timeout_s
        self.by_name = {t.name: t for t in tools}
        self.pool = tool_pool(tools, options.workers, options.tool_memory_mb)

    def run(self, call: ToolCall) -> tuple[str, bool]:
        """(the result as text, whether it failed)."""
        if call.name not in self.by_name:
            return f"error: no tool named {call.name!r}; there are {sorted(self.by_name)}", True
        value, kind, message = self.pool.call((call.name, call.arguments), self.timeout_s)
        if kind == "ok":
            return value, False
        if kind == "timeouts":
            return f"error: the tool {call.name} timed out after {self.timeout_s:g} s", True
        if kind == "crashes":
            return f"error: the tool {call.name} crashed: {message}", True
        return f"error: {message.strip().splitlines()[-1]}", True  # `Type: message`, the traceback's last line

    def step(self, turn: Turn) -> EnvStep:
        parsed = self.parse(turn.text)
        if not parsed.calls and not parsed.errors:
            return EnvStep(done=True)
        messages = [{"role": "tool", "content": f"error: {e}"} for e in parsed.errors]
        errors = len(parsed.errors)
        for call in parsed.calls:
            content, failed = self.run(call)
            messages.append({"role": "tool", "content": content})
            errors += failed
        return EnvStep(messages=messages, tool_calls=len(parsed.calls) + len(parsed.errors), tool_errors=errors)
