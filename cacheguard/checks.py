"""Argument checks shared by every constructor and call that takes a setting.

Every duration is :data:`Seconds`: a number of seconds or a ``timedelta``, made a
float here, so each caller that checks a duration takes both. Redis keeps expiry
times in ms as a 64-bit count from the epoch; a bound far below that (and above
any sane lease, TTL or timeout) turns a typo such as ``1e300`` into an error at
once instead of a raw ``ResponseError`` later. Wrong types raise
:class:`TypeError`, wrong values :class:`ValueError`.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from datetime import timedelta
from typing import Final, TypeAlias, TypeVar

__all__ = [
    "MAX_SECONDS",
    "Seconds",
    "check_choice",
    "check_int",
    "check_non_negative",
    "check_positive",
    "check_ratio",
]

MAX_SECONDS: Final = 10 * 365 * 24 * 3600.0  # ten years

Seconds: TypeAlias = float | timedelta
"""A duration: a number of seconds (int or float) or a :class:`datetime.timedelta`."""

_T = TypeVar("_T")


def _number(what: str, value: object) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{what} must be a number of seconds or a timedelta, not {type(value).__name__}"
        )
    return float(value)


def _shown(value: object, number: float) -> str:
    """``value`` in an error; a timedelta with its seconds, the unit the bounds use."""
    return f"{value!r} ({number:.15g} s)" if isinstance(value, timedelta) else repr(value)


def check_positive(what: str, value: object) -> float:
    """``value`` in seconds, as a float, if it is a number or timedelta in (0, MAX_SECONDS]."""
    number = _number(what, value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{what} must be a finite number > 0, got {_shown(value, number)}")
    if number > MAX_SECONDS:
        raise ValueError(
            f"{what} must be at most {MAX_SECONDS:.0f} seconds (ten years), "
            f"got {_shown(value, number)}"
        )
    return number


def check_non_negative(what: str, value: object) -> float:
    """``value`` in seconds, as a float, if it is a number or timedelta in [0, MAX_SECONDS]."""
    number = _number(what, value)
    if not number >= 0:  # also refuses NaN
        raise ValueError(f"{what} must be a number >= 0, got {_shown(value, number)}")
    if number > MAX_SECONDS:
        raise ValueError(
            f"{what} must be at most {MAX_SECONDS:.0f} (ten years), got {_shown(value, number)}"
        )
    return number


def check_ratio(what: str, value: object) -> float:
    """``value`` as a float if it is a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{what} must be a number in [0, 1), got {value!r}")
    return float(value)


def check_int(what: str, value: object, *, minimum: int) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def check_choice(what: str, value: _T, choices: Collection[_T]) -> _T:
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        names = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{what} must be one of {names}, not {value!r}")
    return value
