"""``starts_at`` / ``ends_at``: any schedule, limited to an interval of time.

No window before ``starts_at`` or after ``ends_at`` (both inclusive bounds,
aware UTC); after the last window ``next_after`` answers :data:`NEVER` and
the routine is ``done``. Catch-up lists and counts windows through this
wrapper, so a recovery never replays a window outside the bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from celery_routines.errors import ScheduleError
from celery_routines.schedules.base import (
    NEVER,
    Schedule,
    count_windows,
    first_from,
    first_window,
    last_windows,
)
from celery_routines.schedules.oneoff import OneOffSchedule
from celery_routines.schedules.zones import aware_utc

__all__ = ["BoundedSchedule", "bounded"]


@dataclass(frozen=True)
class BoundedSchedule:
    inner: Schedule
    starts_at: datetime | None = None
    ends_at: datetime | None = None

    def __post_init__(self) -> None:
        starts, ends = self.starts_at, self.ends_at
        if starts is not None and ends is not None and ends < starts:
            raise ScheduleError(
                f"ends_at ({ends.isoformat()}) is before starts_at ({starts.isoformat()})"
            )

    def describe(self) -> str:
        text = self.inner.describe()
        if self.starts_at is not None:
            text += f" from {self.starts_at.isoformat()}"
        if self.ends_at is not None:
            text += f" until {self.ends_at.isoformat()}"
        return text

    def _clip(self, window: datetime) -> datetime:
        return NEVER if self.ends_at is not None and window > self.ends_at else window

    def next_after(self, instant: datetime) -> datetime:
        instant = aware_utc(instant, "instant")
        if self.starts_at is not None and instant < self.starts_at:
            return self._clip(first_from(self.inner, self.starts_at))
        return self._clip(self.inner.next_after(instant))

    def first_window(self, now: datetime) -> datetime:
        if self.starts_at is None:
            return self._clip(first_window(self.inner, now))
        first = first_from(self.inner, self.starts_at)
        if first <= now and not isinstance(self.inner, OneOffSchedule):
            # Started in the past: continue on the chain from starts_at (an
            # interval keeps its grid), the first window after now.
            passed = last_windows(self.inner, first, now, 1)
            first = self.inner.next_after(passed[-1] if passed else first)
        return self._clip(first)

    def first_from(self, start: datetime) -> datetime:
        if self.starts_at is not None:
            start = max(start, self.starts_at)
        return self._clip(first_from(self.inner, start))

    def _span(self, after: datetime, until: datetime) -> tuple[datetime | None, datetime, datetime]:
        """(a first window to count on its own or None, the inner interval's bounds)."""
        after, until = aware_utc(after, "after"), aware_utc(until, "until")
        if self.ends_at is not None:
            until = min(until, self.ends_at)
        if self.starts_at is not None and after < self.starts_at:
            first = first_from(self.inner, self.starts_at)
            return (first, first, until) if first <= until else (None, until, until)
        return None, after, until

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        first, after, until = self._span(after, until)
        if first is not None:
            yield first
        yield from self.inner.windows(after, until) if after < until else ()

    def count_windows(self, after: datetime, until: datetime) -> int:
        first, after, until = self._span(after, until)
        inner = count_windows(self.inner, after, until) if after < until else 0
        return inner + (first is not None)

    def last_windows(self, after: datetime, until: datetime, n: int) -> list[datetime]:
        first, after, until = self._span(after, until)
        tail = last_windows(self.inner, after, until, n) if after < until else []
        if first is not None and len(tail) < n:
            tail = [first, *tail]
        return tail


def bounded(schedule: Schedule, starts_at: datetime | None, ends_at: datetime | None) -> Schedule:
    """``schedule`` limited to ``[starts_at, ends_at]``; itself when unbounded."""
    if starts_at is None and ends_at is None:
        return schedule
    return BoundedSchedule(schedule, starts_at, ends_at)
