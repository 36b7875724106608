"""What a reward function may return: a finite number within float32's reach (`checked`), else a
`BadValue` whose message says what came back and what to return instead."""

from __future__ import annotations

import math
import numbers

from rlpost.data.scalars import finite_number, unwrap_scalar


class BadValue(Exception):
    """Raised by a pool's function when the user's code returned something its caller cannot use
    (counted as `bad_values`)."""


LARGEST_SCORE = 1e19  # above it a float32 loss overflows (advantages' squares): the run trains no step


def checked(raw) -> float:
    """A reward function's value as a float: an int or float, a numpy scalar (`np.float32(1.0)`) or
    a one-element array or tensor; `BadValue` if it is not a finite number (a bool is not one) or
    one too large for the float32 losses (the fourteenth catalogue's t02: 1e39 trained no step)."""
    number, raw = finite_number(raw), unwrap_scalar(raw)
    if number is None and isinstance(raw, numbers.Integral) and not isinstance(raw, bool):
        number = math.inf  # (10**400: beyond a float too, said as too large, not as an error it never raised)
    if number is None:
        hint = f" (return float({raw!r}) for a score)" if isinstance(raw, bool) else ""
        raise BadValue(f"returned {raw!r} ({type(raw).__name__}), not a finite number{hint}")
    if abs(number) > LARGEST_SCORE:
        shown = f"{number:g}" if math.isfinite(number) else f"an integer of {len(str(abs(raw)))} digits"
        raise BadValue(
            f"returned {shown}, beyond +-{LARGEST_SCORE:g}: rewards are computed in float32, whose losses "
            "overflow there and train nothing; scale the reward down"
        )
    return number
