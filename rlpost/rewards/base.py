"""Reward protocol, registry and batch scoring (see `rlpost.rewards`)."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class RewardInput:
    """What a reward function sees of one sample."""

    prompt: str
    response: str
    ground_truth: str
    data_source: str


class RewardFn(Protocol):
    def __call__(self, sample: RewardInput) -> float: ...


REWARDS: dict[str, RewardFn] = {}


def register_reward(name: str):
    """Decorator: make a scorer available as `reward.fn=name` and for `data_source: name` rows."""

    def wrap(fn: RewardFn) -> RewardFn:
        if name in REWARDS:
            raise ValueError(f"reward function {name!r} is registered twice")
        REWARDS[name] = fn
        return fn

    return wrap


def load_user_fn(spec: str) -> RewardFn:
    """`path/to/file.py:name` -> the function `name` defined in that file."""
    path_str, _, name = spec.rpartition(":")
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"reward.fn={spec!r}: no file {path}")
    module_spec = importlib.util.spec_from_file_location(f"rlpost_user_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"reward.fn={spec!r}: {path} defines no function {name!r}")
    return fn


def get_reward_fn(spec: str) -> Callable[[RewardInput], float] | None:
    """The scorer for `reward.fn`; None for `auto` (route each sample by its data_source)."""
    if spec == "auto":
        return None
    if ".py:" in spec:
        return load_user_fn(spec)
    if spec not in REWARDS:
        raise KeyError(
            f"reward.fn={spec!r} is not a registered reward; choose one of "
            f"{sorted(REWARDS)}, 'auto', or 'path/to/file.py:function'"
        )
    return REWARDS[spec]


@dataclass
class RewardResult:
    scores: list[float]
    errors: int = 0
    first_error: str | None = None
    error_rows: list[int] = field(default_factory=list)


def score_samples(
    samples: list[RewardInput], fn: Callable[[RewardInput], float] | None, kwargs: dict[str, Any] | None = None
) -> RewardResult:
    """Score every sample; a failing sample scores 0 and is counted, never fatal.

    `kwargs` (`reward.kwargs`) go to an explicitly chosen `fn`, not to `auto`-routed scorers."""
    kwargs = kwargs or {}
    result = RewardResult(scores=[])
    for i, sample in enumerate(samples):
        scorer = fn if fn is not None else REWARDS.get(sample.data_source)
        try:
            if scorer is None:
                raise KeyError(f"no reward function registered for data_source {sample.data_source!r}; set reward.fn")
            value = float(scorer(sample, **(kwargs if fn is not None else {})))
            if not math.isfinite(value):
                raise ValueError(f"reward is {value}")
        except Exception as e:  # noqa: BLE001  (user code: any failure scores 0 and is counted)
            value = 0.0
            result.errors += 1
            result.error_rows.append(i)
            if result.first_error is None:
                result.first_error = f"sample {i} ({sample.data_source}): {type(e).__name__}: {e}"
        result.scores.append(value)
    return result
