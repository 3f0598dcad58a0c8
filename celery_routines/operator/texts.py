"""The operator's spellings of durations and ceilings, parsed (pure).

``5m``, ``1h30m``, ``7d``, ``90`` (seconds) for durations; ``100/day``,
``100 fires/day``, ``2.5 eur/month`` for ceilings. Errors are ``ValueError``
subclasses naming the option and the bad text.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from celery_routines.errors import RoutinesError
from celery_routines.policy.ceilings import Ceiling

MAX_DURATION_SECONDS = 36525 * 86400
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_EXPONENT = re.compile(r"[eE][+-]?\d+")
_CEILING = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([^\s/]+)?\s*/\s*(\w+)\s*$")


class BadOption(RoutinesError, ValueError):
    """An option's text cannot be read."""


def duration(value: object, label: str) -> timedelta:
    """A duration from ``5m``/``1h30m``/``7d``/seconds, a number of seconds, or a timedelta."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _seconds_of(value.strip().lower(), label)
    else:
        raise BadOption(f"{label} must be a duration such as 5m, 2h or 7d, got {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise BadOption(f"{label} must be a positive duration such as 5m, 2h or 7d, got {value!r}")
    if seconds > MAX_DURATION_SECONDS:
        # timedelta itself overflows near 1e14 s, and an instant plus a
        # duration much longer than this leaves the calendar.
        raise BadOption(
            f"{label} must be at most {MAX_DURATION_SECONDS // 86400}d (100 years), got {value!r}"
        )
    return timedelta(seconds=seconds)


def _seconds_of(text: str, label: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    parts = _PART.findall(text)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != text.replace(" ", ""):
        raise BadOption(
            f"{label} must be a duration such as 30s, 5m, 1h30m, 7d or 2w, got {text!r}"
        )
    return sum(float(number) * UNITS[unit] for number, unit in parts)


def ceiling(value: object) -> Ceiling:
    """A ``Ceiling`` from ``100/day`` or ``2.5 eur/month`` (or a Ceiling)."""
    if isinstance(value, Ceiling):
        return value
    match = _CEILING.match(value) if isinstance(value, str) else None
    if match is None:
        raise BadOption(
            f"--ceiling must look like 100/day or '2.5 eur/month' (limit, optional unit, "
            f"period: hour, day, week or month), got {value!r}"
        )
    number, unit, per = match.groups()
    if unit is not None and _EXPONENT.fullmatch(unit):
        # 1e308/day would read as a limit of 1 in a unit named "e308".
        raise BadOption(
            f"--ceiling {value!r}: write the limit as a plain number such as 100/day or "
            f"'2.5 eur/month', not in exponent form ({number}{unit})"
        )
    limit = float(number)
    return Ceiling(int(limit) if limit.is_integer() else limit, per=per, unit=unit or "fires")
