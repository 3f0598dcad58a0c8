"""Ceiling periods: the half-open spans of real instants a ceiling counts in.

Periods
=======

A period is a half-open span ``[start, end)`` of real instants, read in the
routine's time zone (:func:`period_bounds`):

* ``day``, ``week`` and ``month`` run from local midnight to local midnight
  (of the next day, of the next ISO Monday, of the next 1st). Their length
  follows the local calendar: 23 or 25 hours on a DST day, 743 or 745 hours in
  the month holding the change. A midnight is turned into an instant as "the
  first instant at or after local midnight": a repeated midnight (a clock set
  back from 01:00 to 00:00) is its first occurrence, and a midnight that does
  not exist (America/Santiago and Asia/Beirut start DST *at* midnight: the
  clock goes from 23:59:59 straight to 01:00) is the instant of the jump,
  which the local clock reads as 01:00. A whole calendar day that never
  happened (Pacific/Apia skipped 2011-12-30) is an empty period that contains
  no instant.
* ``hour`` is a real hour of the local clock: it starts when the local clock
  reads ``HH:00`` and never spans a change of UTC offset. Where offsets change
  by whole hours (Europe/Rome, America/New_York) every hour period is exactly
  60 real minutes: the repeated autumn hour is two periods (02:00-03:00 CEST,
  then 02:00-03:00 CET), each with its own budget, and on the spring day the
  hour after 01:00 is 03:00-04:00 with nothing in between. Where the offset
  moves by 30 minutes (Australia/Lord_Howe) the period holding the change is
  cut at it, so it lasts 30 minutes: in spring 02:30-03:00 (the clock skips
  02:00-02:30), in autumn 01:30-02:00 the second time round. An hour period is
  never longer than 60 real minutes, so an hourly ceiling is never diluted.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from celery_routines.errors import ScheduleError
from celery_routines.schedules.zones import aware_utc, instants_of_wall_time, load_zone

PERIODS = ("hour", "day", "week", "month")
_HOUR = timedelta(hours=1)
_MICROSECOND = timedelta(microseconds=1)


def period_bounds(
    instant: datetime, per: str, timezone: str | ZoneInfo
) -> tuple[datetime, datetime]:
    """``(start, end)`` in aware UTC of the ``per`` period holding ``instant``.

    Half-open: ``start <= instant < end``, and ``end`` is the next period's
    start. See the module docstring for DST, half-hour shifts and missing
    midnights.
    """
    instant = aware_utc(instant, "instant")
    zone = zone_of(timezone)
    if per == "hour":
        return _hour_bounds(instant, zone)
    if per in ("day", "week", "month"):
        return _calendar_bounds(instant, per, zone)
    raise ScheduleError(f"ceiling period {per!r} is unknown; use one of {', '.join(PERIODS)}")


def zone_of(timezone: str | ZoneInfo) -> ZoneInfo:
    return timezone if isinstance(timezone, ZoneInfo) else load_zone(timezone)


def _offset(instant: datetime, zone: ZoneInfo) -> timedelta:
    # A ZoneInfo has an offset for every aware instant; `or` only satisfies typing.
    return instant.astimezone(zone).utcoffset() or timedelta(0)


def _hour_bounds(instant: datetime, zone: ZoneInfo) -> tuple[datetime, datetime]:
    # Work with the offset in force at the instant: it says which of two
    # repeated wall hours we are in, and the hour it gives is a real hour.
    offset = _offset(instant, zone)
    wall = instant.replace(tzinfo=None) + offset
    start = wall.replace(minute=0, second=0, microsecond=0) - offset
    start = start.replace(tzinfo=UTC)
    end = start + _HOUR
    # tzdata never changes a zone's offset twice within days, so at most one
    # change falls in [start, end): cut the period there.
    if _offset(start, zone) != offset:
        start = _offset_change(start, instant, zone)
    last = end - _MICROSECOND
    if _offset(last, zone) != offset:
        end = _offset_change(instant, last, zone)
    return start, end


def _offset_change(before: datetime, after: datetime, zone: ZoneInfo) -> datetime:
    """The first instant in ``(before, after]`` whose offset differs from
    ``before``'s; there must be exactly one change in between."""
    old = _offset(before, zone)
    low, high = before, after  # invariant: offset(low) == old != offset(high)
    while high - low > _MICROSECOND:
        middle = low + (high - low) / 2
        if _offset(middle, zone) == old:
            low = middle
        else:
            high = middle
    return high


def _local_midnight(day: date, zone: ZoneInfo) -> datetime:
    """The first instant at or after local midnight of ``day`` (aware UTC)."""
    wall = datetime.combine(day, time())
    found = instants_of_wall_time(wall, zone)
    if found:
        return found[0]  # a repeated midnight: its first occurrence
    # Midnight is in a spring gap: the clock jumped over it. For a time in a
    # gap, fold=1 maps with the offset after the jump (an instant before it)
    # and fold=0 with the offset before (an instant at or after it).
    before = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    after = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    return _offset_change(before, after, zone)


def _period_first_day(day: date, per: str) -> date:
    if per == "week":
        return day - timedelta(days=day.weekday())  # ISO weeks start on Monday
    if per == "month":
        return day.replace(day=1)
    return day


def _next_first_day(day: date, per: str) -> date:
    if per == "week":
        return day + timedelta(days=7)
    if per == "month":
        return date(day.year + day.month // 12, day.month % 12 + 1, 1)
    return day + timedelta(days=1)


def _calendar_bounds(instant: datetime, per: str, zone: ZoneInfo) -> tuple[datetime, datetime]:
    first_day = _period_first_day(instant.astimezone(zone).date(), per)
    # The instant's own local date always starts at or before it: to read a
    # date the clock either passed its midnight or jumped over it.
    start = _local_midnight(first_day, zone)
    next_day = _next_first_day(first_day, per)
    end = _local_midnight(next_day, zone)
    # A clock set back across midnight reads yesterday's date after today's
    # midnight has passed, and a skipped calendar day is an empty period:
    # both put the instant in a later period than its date says.
    while instant >= end:
        start, next_day = end, _next_first_day(next_day, per)
        end = _local_midnight(next_day, zone)
    return start, end
