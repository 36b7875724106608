"""One number from the containers it arrives in: pandas and `datasets` hand a column's values as
numpy scalars, and reward functions often return numpy or torch scalars."""

from __future__ import annotations

import decimal
import math
import numbers


def unwrap_scalar(value):
    """A numpy scalar or one-element array, or a one-element torch tensor, as its Python number
    (`.item()`); anything else as it is."""
    if not hasattr(value, "item"):
        return value
    numel = getattr(value, "numel", None)
    size = numel() if callable(numel) else getattr(value, "size", None)
    return value.item() if size == 1 else value


def finite_number(value) -> float | None:
    """`value` (unwrapped: `unwrap_scalar`) as a float where it is a finite int, float, Fraction or
    Decimal (the fifteenth catalogue's t13); None for anything else (a bool is not a number here:
    `True` as a score is a mistake, not 1.0)."""
    value = unwrap_scalar(value)
    if isinstance(value, decimal.Decimal):
        value = float(value) if value.is_finite() else math.nan  # (1e400 becomes inf: refused below)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:  # (an int beyond a float's range, 10**400, raised OverflowError here: the sixteenth catalogue's t89)
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def plain_number(value: numbers.Real) -> str:
    """A finite number as a person writes it: 123.0 (an integer column as pandas writes it) is "123",
    1e-05 is "0.00001" (the fifteenth catalogue's t49: a ground truth written 0.00001 reached the
    reward as '1e-05', which a scorer comparing text scores wrong)."""
    if float(value).is_integer():
        return str(int(value))
    return f"{decimal.Decimal(repr(float(value))):f}"
