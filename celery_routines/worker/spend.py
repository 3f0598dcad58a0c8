"""``spend()``: what the current run cost, reported from inside the task."""

from __future__ import annotations

import math
from contextvars import ContextVar

from celery_routines.errors import RoutinesError

_current: ContextVar[dict[str, float] | None] = ContextVar("celery_routines_spend", default=None)


def spend(amount: float, unit: str = "fires") -> None:
    """Add ``amount`` of ``unit`` to the current run's spend.

    Outside a routine run (a task called directly, or not by beat) it does
    nothing, so the same task code works in both cases.
    """
    if (
        isinstance(amount, bool)
        or not isinstance(amount, int | float)
        or not math.isfinite(amount)
        or amount < 0
    ):
        raise RoutinesError(f"spend amount must be a non-negative number, got {amount!r}")
    if not isinstance(unit, str) or not unit:
        raise RoutinesError(f"spend unit must be a non-empty string, got {unit!r}")
    ledger = _current.get()
    if ledger is not None:
        ledger[unit] = ledger.get(unit, 0) + amount


def begin_run() -> None:
    """Start a run's ledger: every run costs one fire on its own."""
    _current.set({"fires": 1})


def end_run() -> dict[str, float] | None:
    ledger = _current.get()
    _current.set(None)
    return ledger
