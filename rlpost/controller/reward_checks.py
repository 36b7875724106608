"""A reward function tried before any actor starts (`check_reward_values`): what cannot score,
refused with `reward.fn` named; `reward.kwargs` checked against rlpost's own scorers."""

from __future__ import annotations

import dataclasses

from rlpost.config import ConfigError, TrainConfig
from rlpost.config.rules_mode import given
from rlpost.controller.scoring import not_loaded
from rlpost.data.dataset import PromptRow
from rlpost.rewards import REWARDS, RewardInput
from rlpost.rewards.base import TRUSTED, check_call, is_trusted
from rlpost.rewards.pool import RewardPool


def check_builtin_kwargs(fn: str, kwargs: dict) -> None:
    """`reward.kwargs` go to an explicitly named reward function: with `auto`, or one of rlpost's
    scorers that does not take them, refused before any actor starts (every sample would fail)."""
    if kwargs and fn == "auto":
        raise ConfigError(f"reward.kwargs={kwargs} go to an explicitly named reward.fn, and reward.fn=auto names none")
    if fn in REWARDS:
        try:
            check_call(REWARDS.get(fn), kwargs, fn)  # as the reward pool checks a user's function
        except TypeError as e:
            raise ConfigError(str(e)) from None
    if fn in REWARDS and kwargs:  # their values, on a first try (cat10's t77: every sample of step 1 failed)
        try:
            REWARDS.get(fn)(RewardInput("1 + 1 =", "2", "2", fn), **kwargs)
        except (ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"reward.kwargs={kwargs}: reward.fn={fn} refuses them on a first try: {e}") from None


def check_reward_values(cfg: TrainConfig, rows: list[PromptRow], log=print, pool: RewardPool | None = None) -> None:
    """A reward function of the user's (not rlpost's own scorers) scores one sample before any actor
    starts: the first training row, its ground truth as the response. A function that cannot be
    loaded or returns something that is no number stops the run here, naming `reward.fn`, not
    after the actors started, and so does a failure that no response causes (`FAILS_ON_EVERY_SAMPLE`:
    a name or field that does not exist, an import, memory, a process of its own); one that raises
    otherwise or times out on that sample is said and counted as the run goes (it may fail on this
    made-up response only). Multi-turn runs score in their
    environment. In the run's `pool` (kept open: its worker has run the user's file once and
    scores with it from then on), else in a pool of one worker for the try."""
    r = cfg.reward
    check_builtin_kwargs(r.fn, dict(r.kwargs))
    pool_keys = given(r, "timeout_s", "num_workers", "memory_mb")  # (config may not import rewards: checked here)
    if r.fn in TRUSTED and pool_keys:  # (the fourteenth catalogue's t16: taken and ignored)
        raise ConfigError(
            f"{', '.join('reward.' + k for k in pool_keys)}: read only by the reward pool, which runs your own "
            f"functions, and reward.fn={r.fn} is rlpost's own scorer (run in the controller): leave them out"
        )
    untrusted = [row for row in rows if not is_trusted(r.fn, row.data_source)]
    if r.fn in REWARDS and rows and not cfg.env.name:
        check_own_scorer(r.fn, dict(r.kwargs), rows[0])
    if not untrusted or cfg.env.name:
        return
    row, own = untrusted[0], pool is None
    pool = RewardPool(r.fn, r.kwargs, 1, r.timeout_s, r.memory_mb, r.error_score) if own else pool
    try:
        pool.load()  # (the run's has: a no-op) the file's own error, as the start's
        scores = pool.score([first_try(row)])
    except RuntimeError as e:
        raise not_loaded(r.fn, e, r.memory_mb) from None
    finally:
        if own:
            pool.close()
    if not scores.error_rows:
        return
    tried = f"reward.fn={r.fn!r} on a first try (a training row, its ground truth {row.ground_truth!r} as the response)"
    error = scores.first_error.removeprefix("sample 0: ")
    if scores.counts["bad_values"]:
        raise ConfigError(
            f"{tried}: {error}\nA reward function must return a number (int, float, a numpy or torch scalar)"
        )
    if scores.counts["crashes"]:  # the process went (os._exit, a crash in native code): every sample would too
        raise ConfigError(f"{tried}: {error}\nThe function ended its process; it must return a number")
    last = error.strip().splitlines()[-1]
    if any(last.startswith(kind) for kind in FAILS_ON_EVERY_SAMPLE):  # (the seventeenth catalogue's t42, t44, t47)
        fields = ", ".join(f.name for f in dataclasses.fields(RewardInput))
        raise ConfigError(f"{tried}: {error}\nThis fails whatever the response (a sample has {fields})")
    if r.kwargs and scores_without_kwargs(cfg, row):  # (the eighteenth catalogue's t11: trained on failures)
        raise ConfigError(
            f"reward.kwargs={dict(r.kwargs)}: {tried} failed with them ({last}), and scores without them: give "
            "values of the kinds the function takes"
        )
    log(f"warning: {tried} failed: {last}; such samples score reward.error_score")


def first_try(row: PromptRow) -> RewardInput:
    """The sample a first try scores: `row` answered with its own ground truth."""
    return RewardInput(row.prompt_text, row.ground_truth, row.ground_truth, row.data_source)


def scores_without_kwargs(cfg: TrainConfig, row: PromptRow) -> bool:
    """Whether the user's `reward.fn` scores the first try's sample when given no `reward.kwargs`
    (a function that needs them cannot: False)."""
    r = cfg.reward
    pool = RewardPool(r.fn, {}, 1, r.timeout_s, r.memory_mb, r.error_score)
    try:
        return not pool.score([first_try(row)]).error_rows
    except RuntimeError:
        return False
    finally:
        pool.close()


def check_own_scorer(fn: str, kwargs: dict, row: PromptRow) -> None:
    """rlpost's scorer named by `reward.fn`, on the first training row with its ground truth as the
    response: one that raises there cannot score these rows, which are another task's (the seventeenth
    catalogue's t137: reward.fn=reasoning_gym on arithmetic rows trained on zeros after the actors started)."""
    try:
        REWARDS.get(fn)(first_try(row), **kwargs)
    except Exception as e:  # noqa: BLE001  (rlpost's own scorer, in this process: what it raises is the answer)
        raise ConfigError(
            f"reward.fn={fn} cannot score the first training row (its ground truth {row.ground_truth[:60]!r} as the "
            f"response): {type(e).__name__}: {e}; these rows look like another task's: choose their scorer, or "
            "reward.fn=auto (by each row's data_source)"
        ) from None


FAILS_ON_EVERY_SAMPLE = (  # a first try's failures that no response causes: the run would score nothing
    "NameError",
    "ImportError",
    "ModuleNotFoundError",
    "MemoryError",
    "AttributeError: 'RewardInput' object has no attribute",
    "AssertionError: daemonic processes are not allowed",
)
