"""Several specs per routine: the union of their windows (issue 3 of 34).

``schedule=["0 9 * * 1-5", "0 12 * * 6", 3600]`` fires on every window of any
of its specs; an instant two specs share fires once, with one key (the key is
the routine name plus the instant, whichever spec produced it). Temporal's
``ScheduleSpec`` is the precedent, and like its ``IntervalSpec`` an interval
inside a union is a grid anchored on the Unix epoch: alone, an interval is
anchored on its previous window, which in a union could be another spec's
window and would drag the interval's grid around.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from celery_routines.errors import ScheduleError
from celery_routines.schedules.base import (
    NEVER,
    Schedule,
    first_from,
    first_window,
    last_windows,
)
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.zones import aware_utc

__all__ = ["EpochGridSchedule", "UnionSchedule", "spec_list"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_SPECS = 20


@dataclass(frozen=True)
class EpochGridSchedule:
    """An interval as a fixed grid: ``EPOCH + k * seconds``."""

    interval: IntervalSchedule

    def describe(self) -> str:
        return self.interval.describe()

    def _index(self, instant: datetime) -> int:
        """The grid point at or before ``instant``."""
        return (aware_utc(instant, "instant") - EPOCH) // self.interval.step

    def next_after(self, instant: datetime) -> datetime:
        return EPOCH + (self._index(instant) + 1) * self.interval.step

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        step, last = self.interval.step, self._index(until)
        for k in range(self._index(after) + 1, last + 1):
            yield EPOCH + k * step

    def count_windows(self, after: datetime, until: datetime) -> int:
        return max(0, self._index(until) - self._index(after))

    def last_windows(self, after: datetime, until: datetime, n: int) -> list[datetime]:
        first = max(self._index(after) + 1, self._index(until) - n + 1)
        return [EPOCH + k * self.interval.step for k in range(first, self._index(until) + 1)]


@dataclass(frozen=True)
class UnionSchedule:
    specs: tuple[Schedule, ...]

    def __post_init__(self) -> None:
        if not 2 <= len(self.specs) <= MAX_SPECS:
            raise ScheduleError(
                f"a list of schedules needs 2 to {MAX_SPECS} specs, got {len(self.specs)}"
            )

    def describe(self) -> str:
        return " + ".join(spec.describe() for spec in self.specs)

    def next_after(self, instant: datetime) -> datetime:
        return min((spec.next_after(instant) for spec in self.specs), default=NEVER)

    def first_window(self, now: datetime) -> datetime:
        return min(first_window(spec, now) for spec in self.specs)

    def first_from(self, start: datetime) -> datetime:
        return min(first_from(spec, start) for spec in self.specs)

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        last: datetime | None = None
        for window in heapq.merge(*(spec.windows(after, until) for spec in self.specs)):
            if window != last:
                last = window
                yield window

    def last_windows(self, after: datetime, until: datetime, n: int) -> list[datetime]:
        newest = set()
        for spec in self.specs:
            newest.update(last_windows(spec, after, until, n))
        return sorted(newest)[-n:] if n > 0 else []


def spec_list(value: object) -> list[str | float]:
    """The specs of a ``schedules`` column (a JSON list of cron or rrule
    strings and interval seconds) or of a ``schedule=[...]`` declaration."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ScheduleError(f"schedules is not a valid JSON list ({exc}): {value!r}") from None
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ScheduleError(f"schedules must be a list of specs, got {value!r}")
    specs: list[str | float] = []
    for entry in value:
        spec = entry.total_seconds() if isinstance(entry, timedelta) else entry
        if isinstance(spec, bool) or not isinstance(spec, str | int | float):
            raise ScheduleError(
                f"schedule list entry {spec!r} must be a cron or rrule string, a timedelta or "
                "a number of seconds"
            )
        specs.append(spec)
    return specs
