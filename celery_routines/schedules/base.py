"""The Schedule protocol every schedule kind implements."""

from __future__ import annotations

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
