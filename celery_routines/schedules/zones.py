"""Time zones and the contract's rules for local wall times (guarantee 4).

A naive datetime here is always a *local wall time* in some zone; aware values
are instants. zoneinfo's ``fold`` already encodes what the contract asks for:

* ``fold=0`` on a wall time in a spring gap uses the offset from *before* the
  gap, so 02:30 in Rome on 2026-03-29 becomes 01:30 UTC (03:30 CEST): the time
  is shifted forward by the gap, not lost.
* ``fold=0`` on a repeated (autumn) wall time picks the *first* occurrence.

We never compare aware datetimes of the same zone directly: zoneinfo treats
the two folds of a repeated time as equal (FIELD-NOTES "Time"). Everything is
converted to UTC first.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery_routines.errors import ScheduleError

__all__ = [
    "aware_utc",
    "instants_of_wall_time",
    "is_ambiguous",
    "is_nonexistent",
    "load_zone",
    "local_to_utc_first",
    "steady_offset",
]


def load_zone(name: str) -> ZoneInfo:
    """The IANA zone called ``name``; :class:`ScheduleError` if there is none."""
    if not isinstance(name, str) or not _plausible_zone_name(name):
        raise _unknown_zone(name)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        # ValueError: malformed keys (absolute or relative paths); OSError: a
        # key that names a directory or an unreadable file under the TZPATH.
        raise _unknown_zone(name) from exc


def _plausible_zone_name(name: str) -> bool:
    # zoneinfo already refuses most path tricks, but we refuse them before any
    # file is opened so a key can never walk out of the tz database.
    return (
        bool(name)
        and name == name.strip()
        and ".." not in name
        and not name.startswith("/")
        and "\\" not in name
        and "\x00" not in name
    )


def _unknown_zone(name: object) -> ScheduleError:
    return ScheduleError(
        f"unknown timezone {name!r}: use an IANA name such as 'Europe/Rome' or 'UTC'"
    )


def aware_utc(instant: datetime, name: str = "instant") -> datetime:
    """``instant`` converted to UTC; a naive datetime is a caller bug (ValueError).

    Unlike :func:`celery_routines.clock.as_utc` we do not guess that a naive
    value is UTC: in schedule math a naive value is a local wall time.
    """
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {instant!r}")
    return instant.astimezone(UTC)


def _require_naive(wall: datetime) -> None:
    if wall.tzinfo is not None:
        raise ValueError(f"expected a naive local wall time, got {wall.isoformat()}")


def local_to_utc_first(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant (aware UTC) at which the local wall time ``wall`` fires.

    Non-existent (spring gap): the offset from before the gap, i.e. the wall
    time shifted forward by the gap. Ambiguous (autumn): the first occurrence.
    """
    _require_naive(wall)
    return wall.replace(tzinfo=zone, fold=0).astimezone(UTC)


def instants_of_wall_time(wall: datetime, zone: ZoneInfo) -> tuple[datetime, ...]:
    """Every real instant (aware UTC, ascending) whose local wall time is ``wall``.

    Two for a repeated time, none for a time in a spring gap, one otherwise.
    """
    _require_naive(wall)
    found: list[datetime] = []
    for fold in (0, 1):
        instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        # A gap time maps to an instant whose wall clock reads something else.
        if instant.astimezone(zone).replace(tzinfo=None) == wall and instant not in found:
            found.append(instant)
    found.sort()
    return tuple(found)


def is_nonexistent(wall: datetime, zone: ZoneInfo) -> bool:
    """True when ``wall`` is skipped by a spring-forward transition in ``zone``."""
    return not instants_of_wall_time(wall, zone)


def is_ambiguous(wall: datetime, zone: ZoneInfo) -> bool:
    """True when ``wall`` happens twice in ``zone`` (a fall-back transition)."""
    return len(instants_of_wall_time(wall, zone)) == 2


# Probing every 6 hours is far denser than needed: across the whole tz database
# (1900 onwards) two offset changes of one zone are never less than 4 days apart.
_PROBE_STEP = timedelta(hours=6)


def steady_offset(zone: ZoneInfo, start: datetime, end: datetime) -> timedelta | None:
    """The UTC offset of ``zone`` if it is constant over wall times [start, end].

    ``None`` when a transition (gap or overlap) may fall inside the span. Used
    to take arithmetic fast paths on ordinary days; the answer is conservative
    (probes at both ends and every 6 hours, checking both folds).
    """
    _require_naive(start)
    _require_naive(end)
    offset: timedelta | None = None
    probe = start
    while True:
        first = probe.replace(tzinfo=zone, fold=0).utcoffset()
        second = probe.replace(tzinfo=zone, fold=1).utcoffset()
        if first != second or (offset is not None and first != offset):
            return None
        offset = first
        if probe >= end:
            return offset
        probe = min(probe + _PROBE_STEP, end)
