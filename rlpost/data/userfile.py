"""A user's own function named on the command line as `path/to/file.py:name` (a reward function,
an environment factory; `name` may be an attribute path, `Class.method`), with errors that name the
config key."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
import threading
import traceback
from pathlib import Path
from typing import Callable

SLOW_S = 10  # a file still running after this long is said to be
DYNAMIC = {"*", "__getattr__", "exec", "globals", "setattr", "vars"}  # names that may bind any other


def user_file(spec: str, key: str) -> tuple[Path, str]:
    """`path/to/file.py:name` -> (the file, the name); the file must exist."""
    path_str, _, name = spec.rpartition(":")
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{key}={spec!r}: no file {path}")
    return path, name


def check_file(spec: str, key: str) -> None:
    """What can be known of `path/to/file.py:name` without running the file (which may load a
    model at import): it exists, parses, and binds `name` somewhere (or may: a star import, a
    module `__getattr__`, `exec`, `globals()`, `setattr`). The file runs where the function is called."""
    path, name = user_file(spec, key)
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as e:
        raise ValueError(f"{key}={spec!r}: {path} line {e.lineno}: SyntaxError: {e.msg}") from None
    bound = set()  # every name the file binds anywhere (or a way to bind any): a refusal is certain
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Name) and (isinstance(node.ctx, ast.Store) or node.id in DYNAMIC):
            bound.add(node.id)
    top = name.split(".")[0]  # `Class.method`: an attribute path, as entry points name one (the 19th's t40)
    if not bound & {top, *DYNAMIC}:
        raise AttributeError(f"{key}={spec!r}: {path} defines no {'function' if top == name else 'name'} {top!r}")
    if any(isinstance(node, ast.AsyncFunctionDef) and node.name == name for node in tree.body):
        raise ValueError(not_awaited(spec, key, name))


def not_awaited(spec: str, key: str, name: str) -> str:
    return f"{key}={spec!r}: {name} is an async function, which rlpost does not await: write it with def"


def load_from_file(spec: str, key: str) -> Callable:
    """`path/to/file.py:name` -> the callable `name` defined in that file (the file is run)."""
    path, name = user_file(spec, key)
    folder = str(path.resolve().parent)  # as `python file.py` does: modules beside the file import
    if folder not in sys.path:
        sys.path.insert(0, folder)
    slow = threading.Timer(
        SLOW_S, lambda: print(f"rlpost: {key}={spec!r}: still running {path} after {SLOW_S} s", file=sys.stderr)
    )
    slow.daemon = True
    slow.start()  # a file that loads a model at import is said to be running, not silent
    try:
        module = run_file(path, f"rlpost_user_{key.replace('.', '_')}_{path.stem}")
    except SyntaxError as e:
        raise ValueError(f"{key}={spec!r}: {path} line {e.lineno}: SyntaxError: {e.msg}") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001  (the user's module, run: whatever it raises is named)
        lines = [
            f.lineno for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path.resolve()
        ]
        where = f" at line {lines[-1]}" if lines else ""
        raise ValueError(f"{key}={spec!r}: running {path} raised {type(e).__name__}{where}: {e}") from e
    finally:
        slow.cancel()
    fn, found = module, []
    for part in name.split("."):  # `Class.method` as entry points name one
        if not hasattr(fn, part):
            missing = ".".join([*found, part])
            raise AttributeError(
                f"{key}={spec!r}: {path} defines no {'function' if missing == name else 'name'} {missing!r}"
            )
        fn = getattr(fn, part)
        found.append(part)
    if not callable(fn):
        raise AttributeError(f"{key}={spec!r}: {path} defines {name!r} as a {type(fn).__name__}, not a function")
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        raise ValueError(not_awaited(spec, key, name))
    return fn


def run_file(path: Path | str, module_name: str):
    """The module of the Python file at `path`, run under `module_name` and registered in
    `sys.modules`, so that what it defines can be found by module and name (tool workers do)."""
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    return module
