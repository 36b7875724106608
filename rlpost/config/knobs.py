"""How a config key is declared: `knob` (a leaf with its help, closed set or range) and `section`."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def knob(
    default: Any,
    help: str,
    choices: tuple | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
):
    """A config field with its one-line documentation, and the values it allows: a closed set
    (`choices`) or a range (`ge`/`gt` below, `le`/`lt` above). `validate` checks both."""
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    if bounds:
        meta["range"] = bounds
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls, help: str):
    return field(default_factory=cls, metadata={"help": help})
