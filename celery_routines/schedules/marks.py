"""Readable daylight-saving notes for windows, for operators (``show``, ``preview``).

Pure: given a schedule and one of its windows, say whether DST touched it:

* a fixed-hour cron whose wall time does not exist fires shifted by the gap
  (guarantee 4): ``shifted: 02:30 does not exist``;
* a fixed-hour cron whose wall time happens twice fires at the first one:
  ``first of two 02:30s``;
* a real-time cron (``*/15 * * * *``) fires in both passes of a repeated hour:
  ``first of two 02:30s`` / ``second of two 02:30s``.

Intervals are elapsed time and never get a note.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from celery_routines.schedules.base import Schedule
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.cronspec import CronSpec, days_from, parse_cron
from celery_routines.schedules.zones import (
    aware_utc,
    instants_of_wall_time,
    is_nonexistent,
    load_zone,
    local_to_utc_first,
)

__all__ = ["dst_note"]

# Looking this far back for the offset before a spring gap covers every gap
# in the tz database (at most 24 hours).
_LOOK_BACK = timedelta(hours=25)


def dst_note(schedule: Schedule, window: datetime) -> str | None:
    """A short note when DST moved or doubled ``window``; None otherwise."""
    if not isinstance(schedule, CronSchedule):
        return None
    window = aware_utc(window, "window")
    zone = load_zone(schedule.timezone)
    wall = window.astimezone(zone).replace(tzinfo=None)
    spec = parse_cron(schedule.expression)
    if not schedule.real_time:
        shifted_from = _nominal_before_gap(spec, window, wall, zone)
        if shifted_from is not None:
            return f"shifted: {shifted_from:%H:%M} does not exist"
    instants = instants_of_wall_time(wall, zone)
    if len(instants) == 2:
        which = "first" if window == instants[0] else "second"
        return f"{which} of two {wall:%H:%M}s"
    return None


def _nominal_before_gap(
    spec: CronSpec, window: datetime, wall: datetime, zone: ZoneInfo
) -> datetime | None:
    """The non-existent wall time this window stands in for, if any."""
    offset_now = window.astimezone(zone).utcoffset()
    offset_before = (window - _LOOK_BACK).astimezone(zone).utcoffset()
    if offset_now is None or offset_before is None or offset_now <= offset_before:
        return None
    nominal = wall - (offset_now - offset_before)
    if not is_nonexistent(nominal, zone):
        return None
    if local_to_utc_first(nominal, zone) != window:
        return None
    minute_of_day = nominal.hour * 60 + nominal.minute
    if minute_of_day not in spec.minutes_of_day:
        return None
    if next(days_from(spec, nominal.date()), None) != nominal.date():
        return None
    return nominal
