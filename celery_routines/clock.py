"""The clock seam: the one place that reads the wall clock.

Everything else takes the time as an argument, so tests inject a clock and
never sleep to wait for time to pass.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current instant as an aware UTC datetime."""
    return datetime.now(UTC)


def as_utc(instant: datetime) -> datetime:
    """``instant`` in UTC; a naive value is taken to be UTC already."""
    if instant.tzinfo is None:
        return instant.replace(tzinfo=UTC)
    return instant.astimezone(UTC)
