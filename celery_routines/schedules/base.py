"""The Schedule protocol every schedule kind implements."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Protocol

NEVER = datetime(9999, 1, 1, tzinfo=UTC)
"""What ``next_after`` answers when a schedule has no window left (a one-off
that fired, a schedule past its ``ends_at``): a routine whose next window is
``NEVER`` is ``done``. An instant, not None, so every caller that compares or
stores the next window keeps working, and the due-query never reaches it."""

ONE_MICROSECOND = timedelta(microseconds=1)


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


def is_never(instant: datetime | None) -> bool:
    """Whether ``instant`` is :data:`NEVER` (the schedule has ended)."""
    return instant is not None and instant >= NEVER


def first_window(schedule: Schedule, now: datetime) -> datetime:
    """The window a routine adopted at ``now`` starts from: ``next_after(now)``,
    except that a schedule may say otherwise (a one-off whose instant passed
    before it was adopted still fires once; ``starts_at`` in the future)."""
    first = getattr(schedule, "first_window", None)
    if first is not None:
        return first(now)  # type: ignore[no-any-return]
    return schedule.next_after(now)


def first_from(schedule: Schedule, start: datetime) -> datetime:
    """The first window at or after ``start``."""
    own = getattr(schedule, "first_from", None)
    if own is not None:
        return own(start)  # type: ignore[no-any-return]
    return schedule.next_after(start - ONE_MICROSECOND)


def walk_windows(schedule: Schedule, after: datetime, until: datetime) -> Iterator[datetime]:
    """Every window in ``(after, until]`` by walking ``next_after`` (for
    schedules with no arithmetic of their own: solar events, rrules)."""
    window = schedule.next_after(after)
    while window <= until:
        yield window
        window = schedule.next_after(window)


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
