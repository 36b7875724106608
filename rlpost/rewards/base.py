"""Reward protocol and registry (see `rlpost.rewards`); scoring runs in `rlpost.rewards.executor`."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from rlpost.data.userfile import check_file, load_from_file
from rlpost.registry import Registry


@dataclass(frozen=True)
class RewardInput:
    """What a reward function sees of one sample."""

    prompt: str
    response: str
    ground_truth: str
    data_source: str


class RewardFn(Protocol):
    def __call__(self, sample: RewardInput) -> float: ...


# `@REWARDS.register(name)` makes a scorer available as `reward.fn=name` and for `data_source: name`
# rows. `trusted=True` is for reviewed code whose time is linear in the response and which cannot
# crash the process (rlpost's own string and regular-expression scorers): it is scored in the
# controller's process, where a call costs what it costs; everything else runs in the pool.
REWARDS: Registry[RewardFn] = Registry("reward", key="reward.fn", others="'auto', 'path/to/file.py:function'")
TRUSTED: set[str] = REWARDS.flagged("trusted")  # registered scorers that run in the controller's process


def is_trusted(spec: str, data_source: str) -> bool:
    """Whether `reward.fn=spec` scores a sample of `data_source` with one of rlpost's own scorers
    (in the controller's process), not the user's code (in the reward pool's workers)."""
    return spec in TRUSTED or (spec == "auto" and data_source in TRUSTED)


def load_user_fn(spec: str) -> RewardFn:
    """`path/to/file.py:name` -> the function `name` defined in that file."""
    return load_from_file(spec, "reward.fn")


def check_call(fn: Callable, kwargs: dict, spec: str) -> None:
    """`fn(sample, **kwargs)` must be a call `fn` takes: refuse a function written for another
    framework's signature (`reward(prompt, response, ground_truth)`) before it scores anything, and a
    class (called, it would make an instance, not a score: the fifteenth catalogue's t33)."""
    if inspect.isclass(fn):
        name, _, _ = spec.rpartition(":")
        raise TypeError(
            f"reward.fn={spec!r} is a class: rlpost calls reward.fn with each sample, which would make an instance "
            f"of it, not a score; name an instance (scorer = {fn.__name__}() in the file, "
            f"reward.fn={name or 'FILE'}:scorer) or a function"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: its call will say
        return
    try:
        signature.bind(None, **kwargs)
    except TypeError as e:
        if kwargs and takes_one_sample(signature):  # the function is right; the kwargs are what it does not take
            raise TypeError(
                f"reward.kwargs={kwargs}: reward.fn={spec} takes {signature} ({e}); leave out the rest"
            ) from None
        missing = needed_kwargs(signature, kwargs)
        if missing:  # (cat20's t46: `def score(s, *, scale)` was told to read the sample's fields)
            give = " ".join(f"+reward.kwargs.{name}=VALUE" for name in missing)
            raise TypeError(f"reward.fn={spec!r} takes {signature}: give {', '.join(missing)} with {give}") from None
        given = f" and reward.kwargs {sorted(kwargs)}" if kwargs else ""
        raise TypeError(
            f"reward.fn={spec!r} takes {getattr(fn, '__name__', 'fn')}{signature}, but a reward function is "
            f"called with one sample{given} ({e}): read sample.prompt, sample.response, sample.ground_truth and "
            "sample.data_source from its one argument"
        ) from None


def needed_kwargs(signature: inspect.Signature, kwargs: dict) -> list[str]:
    """The keyword-only parameters without a default that `reward.kwargs` does not give, when giving
    them would make the call bind; else [] (more positional parameters are another framework's
    signature: `reward(prompt, response, ground_truth)`)."""
    params = signature.parameters.values()
    kw_only = inspect.Parameter.KEYWORD_ONLY
    missing = [p.name for p in params if p.kind is kw_only and p.default is p.empty and p.name not in kwargs]
    try:
        signature.bind(None, **kwargs, **dict.fromkeys(missing))
    except TypeError:
        return []
    return missing


def takes_one_sample(signature: inspect.Signature) -> bool:
    try:
        signature.bind(None)
    except TypeError:
        return False
    return True


def get_reward_fn(spec: str) -> Callable[[RewardInput], float] | None:
    """The scorer for `reward.fn`; None for `auto` (route each sample by its data_source)."""
    if spec == "auto":
        return None
    if ".py:" in spec:
        return load_user_fn(spec)
    if spec.endswith(".py"):
        raise ValueError(f"reward.fn={spec!r} names a file, not its function: give reward.fn={spec}:NAME")
    path = Path(spec.rpartition(":")[0] or spec).expanduser()
    if "/" in spec and path.exists():  # (the seventeenth catalogue's t51-t53: "not a registered reward")
        what = "a folder" if path.is_dir() else "compiled Python" if path.suffix == ".pyc" else "not a .py file"
        raise ValueError(f"reward.fn={spec!r}: {path} is {what}; give the function's .py source: path/to/file.py:NAME")
    return REWARDS.get(spec)


def check_reward_fn(spec: str, score_fn: str = "") -> None:
    """`reward.fn` (and a reward model's `score_fn`) checked without running a user's file
    (`check_file`): the CLI's early check. The file runs in the reward pool's workers, the first of
    them on a first try before the actors (a `score_fn` in the reward-model actors: checked here,
    it was found only there, named as reward.fn: the eighteenth catalogue's t42)."""
    if ".py:" in spec:
        check_file(spec, "reward.fn")
    elif spec != "auto":
        get_reward_fn(spec)
    if ".py:" in score_fn:
        check_file(score_fn, "reward.model.score_fn")
