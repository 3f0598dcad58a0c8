"""The Schedule protocol every schedule kind implements."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from datetime import datetime
from typing import Protocol


class Schedule(Protocol):
    """When a routine fires. Pure: the time is always an argument."""

    def next_after(self, instant: datetime) -> datetime:
        """The first window strictly after ``instant`` (aware UTC in and out)."""
        ...

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Every window in ``(after, until]``, ascending, as aware UTC datetimes."""
        ...

    def describe(self) -> str:
        """A short human description, e.g. ``cron '30 2 * * *' in Europe/Rome``."""
        ...


# Our schedules count and list windows arithmetically (``count_windows``,
# ``last_windows``), so a year of missed one-minute windows costs the same as
# one; any other object that satisfies the bare protocol is walked (slowly,
# but correctly).


def count_windows(schedule: Schedule, after: datetime, until: datetime) -> int:
    """How many windows fall in ``(after, until]``."""
    count = getattr(schedule, "count_windows", None)
    if count is not None:
        return int(count(after, until))
    return sum(1 for _ in schedule.windows(after, until))


def last_windows(schedule: Schedule, after: datetime, until: datetime, n: int) -> list[datetime]:
    """The newest ``n`` windows in ``(after, until]``, ascending."""
    if n <= 0:
        return []
    last = getattr(schedule, "last_windows", None)
    if last is not None:
        return list(last(after, until, n))
    return list(deque(schedule.windows(after, until), maxlen=n))
