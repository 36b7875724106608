"""A user's own function named on the command line as `path/to/file.py:name` (a reward function,
an environment factory), with errors that name the config key."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable


def load_from_file(spec: str, key: str) -> Callable:
    """`path/to/file.py:name` -> the callable `name` defined in that file (the file is run)."""
    path_str, _, name = spec.rpartition(":")
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{key}={spec!r}: no file {path}")
    fn = getattr(run_file(path, f"rlpost_user_{key.replace('.', '_')}_{path.stem}"), name, None)
    if not callable(fn):
        raise AttributeError(f"{key}={spec!r}: {path} defines no function {name!r}")
    return fn


def run_file(path: Path | str, module_name: str):
    """The module of the Python file at `path`, run under `module_name` and registered in
    `sys.modules`, so that what it defines can be found by module and name (tool workers do)."""
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    return module
