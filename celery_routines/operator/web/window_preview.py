"""The panel's preview of a definition's next windows, in its zone and in
UTC, with the nights daylight saving changes marked."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery_routines.operator.views import window_view
from celery_routines.operator.windows import take_windows
from celery_routines.schedules.parse import schedule_of
from celery_routines.schedules.zones import load_zone


@dataclass(frozen=True)
class PreviewWindow:
    local: datetime
    utc: datetime
    note: str | None
    """The DST note of a cron's window: ``shifted: 02:30 does not exist``."""
    dst_night: bool
    """The zone's offset changes between the previous window and this one,
    or during this window's (local) day."""


def preview_windows(definition: Any, default_zone: str, now: datetime, n: int = 10) -> list[Any]:
    """The next ``n`` windows of a checked definition from ``now``, in its
    zone and in UTC, with the nights DST changes marked."""
    zone = definition.timezone or default_zone
    schedule = schedule_of(definition, zone)
    tz = load_zone(zone)
    found: list[PreviewWindow] = []
    previous: timedelta | None = None
    for view in [window_view(schedule, w, timezone=zone) for w in take_windows(schedule, now, n)]:
        offset = view.local.utcoffset()
        day = view.local.date()
        midnight = datetime(day.year, day.month, day.day, tzinfo=tz)
        night = midnight.utcoffset() != (midnight + timedelta(days=1)).utcoffset()
        changed = previous is not None and offset != previous
        found.append(PreviewWindow(view.local, view.utc, view.note, night or changed))
        previous = offset
    return found
