"""Ceiling periods (hour, day, ISO week, calendar month) read in a routine's zone.

Pure: the instant is an argument. Period edges are local wall times (midnight,
Monday, the 1st) turned into instants with the contract's DST rule, so a day
that loses an hour is 23 hours long and the next period starts when the local
calendar says so.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from .errors import ScheduleError
from .schedules.zones import aware_utc, load_zone, local_to_utc_first

__all__ = ["period_bounds"]


def period_bounds(instant: datetime, per: str, timezone: str) -> tuple[datetime, datetime]:
    """``[start, end)`` in UTC of the ``per`` period containing ``instant``."""
    zone = load_zone(timezone)
    wall = aware_utc(instant, "instant").astimezone(zone).replace(tzinfo=None)
    if per == "hour":
        start = wall.replace(minute=0, second=0, microsecond=0)
        # Hours are real elapsed time, so a repeated autumn hour is two periods.
        start_utc = aware_utc(instant).replace(minute=0, second=0, microsecond=0)
        if start_utc.astimezone(zone).minute != 0:
            # Zones with half-hour offsets: the local hour starts off the UTC hour.
            start_utc = local_to_utc_first(start, zone)
        return start_utc, start_utc + timedelta(hours=1)
    midnight = wall.replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "day":
        start, end = midnight, midnight + timedelta(days=1)
    elif per == "week":
        start = midnight - timedelta(days=midnight.weekday())
        end = start + timedelta(days=7)
    elif per == "month":
        start = midnight.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
    else:
        raise ScheduleError(f"ceiling period {per!r} is unknown; use hour, day, week or month")
    return local_to_utc_first(start, zone), local_to_utc_first(end, zone)
