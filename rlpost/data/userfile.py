"""A user's own function named on the command line as `path/to/file.py:name` (a reward function,
an environment factory), with errors that name the config key."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import threading
import traceback
from pathlib import Path
from typing import Callable

SLOW_S = 10  # a file still running after this long is said to be


def load_from_file(spec: str, key: str) -> Callable:
    """`path/to/file.py:name` -> the callable `name` defined in that file (the file is run)."""
    path_str, _, name = spec.rpartition(":")
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{key}={spec!r}: no file {path}")
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
    fn = getattr(module, name, None)
    if not callable(fn):
        what = (
            f"{name!r} as a {type(fn).__name__}, not a function" if hasattr(module, name) else f"no function {name!r}"
        )
        raise AttributeError(f"{key}={spec!r}: {path} defines {what}")
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        raise ValueError(f"{key}={spec!r}: {name} is an async function, which rlpost does not await: write it with def")
    return fn


def run_file(path: Path | str, module_name: str):
    """The module of the Python file at `path`, run under `module_name` and registered in
    `sys.modules`, so that what it defines can be found by module and name (tool workers do)."""
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    return module
