"""Fixed-interval schedules: a window every ``seconds``, anchored on the last one.

An interval is real elapsed time, so it ignores time zones and DST entirely:
``next_after(t) == t + seconds``. Counting and listing the windows of an
outage is arithmetic, never a loop over the whole outage.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery_routines.errors import ScheduleError
from celery_routines.schedules.zones import aware_utc

__all__ = ["MAX_INTERVAL_SECONDS", "IntervalSchedule", "whole_second_after", "whole_seconds"]

MAX_INTERVAL_SECONDS = 10 * 366 * 24 * 3600
"""Ten years: anything longer is almost certainly a unit mistake."""


def _format_seconds(seconds: float) -> str:
    # 1e300 is named as 1e+300, not as its 301 digits.
    if float(seconds).is_integer() and abs(seconds) < 1e15:
        return str(int(seconds))
    return repr(float(seconds))


def whole_seconds(seconds: float) -> float:
    """An interval brought over from another scheduler (django-celery-beat,
    RedBeat, ``beat_schedule``) on the whole-second grid windows and their
    keys keep: rounded to the nearest second, and never below one (a
    sub-second interval would otherwise become 0, which never advances).
    Anything not a positive finite number is left for the schedule's own
    check to refuse with its words."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return seconds
    if not math.isfinite(seconds) or seconds <= 0:
        return seconds
    return float(max(1, math.floor(seconds + 0.5)))


def whole_second_after(instant: datetime) -> datetime:
    """``instant`` raised to the next whole second (itself when whole): an
    imported last run's microseconds must not become the grid's."""
    if instant.microsecond == 0:
        return instant
    return instant.replace(microsecond=0) + timedelta(seconds=1)


@dataclass(frozen=True)
class IntervalSchedule:
    """A window every ``seconds`` seconds. Validated when built."""

    seconds: float
    _step: timedelta = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seconds = self.seconds
        # bool is an int subclass; IntervalSchedule(True) is a bug, not 1 second.
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ScheduleError(
                f"interval must be a number of seconds, got {type(seconds).__name__} {seconds!r}"
            )
        if not math.isfinite(seconds):
            raise ScheduleError(f"interval must be a finite number of seconds, got {seconds!r}")
        if seconds <= 0:
            raise ScheduleError(
                f"interval must be positive, got {_format_seconds(seconds)} seconds"
            )
        if seconds > MAX_INTERVAL_SECONDS:
            raise ScheduleError(
                f"interval must be at most {MAX_INTERVAL_SECONDS} seconds (10 years), got "
                f"{_format_seconds(seconds)} seconds: use a cron expression for rare events"
            )
        step = timedelta(seconds=seconds)
        if step <= timedelta(0):
            # timedelta keeps microseconds; a smaller interval would never advance.
            raise ScheduleError(f"interval must be at least 1 microsecond, got {seconds!r} seconds")
        object.__setattr__(self, "seconds", float(seconds))
        object.__setattr__(self, "_step", step)

    @property
    def step(self) -> timedelta:
        """The interval as a ``timedelta`` (rounded to microseconds)."""
        return self._step

    def describe(self) -> str:
        return f"every {_format_seconds(self.seconds)} seconds"

    def next_after(self, instant: datetime) -> datetime:
        """``instant + seconds``: the next window is anchored on the previous one."""
        return aware_utc(instant, "instant") + self._step

    def first_from(self, start: datetime) -> datetime:
        """An interval bounded by ``starts_at`` is anchored on it: its first window."""
        return aware_utc(start, "start")

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """``after + k * seconds`` for k = 1, 2, ... while ``<= until``; lazy."""
        after = aware_utc(after, "after")
        until = aware_utc(until, "until")
        # Multiplying (not adding repeatedly) keeps each window exact and equal
        # to what repeated next_after gives, since timedelta math is integral.
        k = 1
        while (window := after + k * self._step) <= until:
            yield window
            k += 1

    def count_windows(self, after: datetime, until: datetime) -> int:
        """How many windows lie in ``(after, until]``; O(1)."""
        after = aware_utc(after, "after")
        until = aware_utc(until, "until")
        if until <= after:
            return 0
        return (until - after) // self._step

    def last_windows(self, after: datetime, until: datetime, n: int) -> list[datetime]:
        """The newest ``n`` windows in ``(after, until]``, ascending; O(n)."""
        after = aware_utc(after, "after")
        total = self.count_windows(after, until)
        first = max(1, total - n + 1)
        return [after + k * self._step for k in range(first, total + 1)] if n > 0 else []
