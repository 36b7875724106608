"""One registry type for everything a name chooses: estimators, losses, rewards, environments, tasks...

`ADVANTAGES = Registry("advantage estimator", key="Algorithm.advantage")` makes one;
`@ADVANTAGES.register("grpo")` over a function (or `ADVANTAGES.register("grpo", fn)`) adds to it,
once per name; `ADVANTAGES.get("grpo")` (or `ADVANTAGES["grpo"]`) finds it, and an unknown name
raises `UnknownName`, naming the key, the closest names and every name. Names keep their
registration order. A flag given at registration (`register("gae", fn, token_rewards=True)`)
puts the name in `flagged("token_rewards")`, a set that grows with the registry.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from typing import Any, Generic, Iterator, TypeVar

T = TypeVar("T")
_AS_DECORATOR = object()


class UnknownName(KeyError, ValueError):
    """A name nothing is registered under (a KeyError and a ValueError: either catch takes it)."""

    def __str__(self) -> str:  # not KeyError's repr of the message
        return str(self.args[0])


class Registry(Generic[T]):
    """Values by name. `kind` names what they are in messages; `key` is where a name is chosen
    (a config key, `Algorithm.advantage`); `others` what that key takes besides the names
    (`file.py:factory`); `replace`: a name registered again replaces its value instead of being
    refused (for registries that a user's file fills, which may be run more than once)."""

    def __init__(self, kind: str, key: str = "", others: str = "", replace: bool = False):
        self.kind, self.key, self.others, self.replace = kind, key, others, replace
        self._values: dict[str, T] = {}
        self._flagged: defaultdict[str, set[str]] = defaultdict(set)

    def register(self, name: str, value: Any = _AS_DECORATOR, **flags: bool) -> Any:
        """Add `value` under `name` and return it; without a value, a decorator that does."""
        if value is _AS_DECORATOR:
            return lambda v: self.register(name, v, **flags)
        if name in self._values and not self.replace:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._values[name] = value
        for flag, on in flags.items():
            (self._flagged[flag].add if on else self._flagged[flag].discard)(name)
        return value

    def get(self, name: str) -> T:
        if name not in self._values:
            raise UnknownName(self.unknown(name))
        return self._values[name]

    def unknown(self, name: object) -> str:
        """What `get` says of a name that is not registered."""
        where = f"{self.key}={name!r}" if self.key else repr(name)
        close = difflib.get_close_matches(str(name), self.names(), n=3)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        others = f" (or {self.others})" if self.others else ""
        return f"{where} is not a registered {self.kind}{hint}; choose one of {self.names()}{others}"

    def names(self) -> list[str]:
        """Every name, in registration order."""
        return list(self._values)

    def items(self) -> list[tuple[str, T]]:
        return list(self._values.items())

    def flagged(self, flag: str) -> set[str]:
        """The names registered with `flag=True`: the registry's own set, which later registrations fill."""
        return self._flagged[flag]

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {self.names()})"
