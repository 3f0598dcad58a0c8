"""Turning what users write (and what the database stores) into schedules.

``parse_schedule`` accepts everything the contract lists for ``routine()``: a
5-field cron string, a ``timedelta``, a number of seconds, or a Celery
``crontab``/``schedule`` object. ``schedule_from_columns`` rebuilds a schedule
from a ``routines`` row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from celery.schedules import BaseSchedule, crontab, schedule, solar
from croniter import croniter

from celery_routines.errors import ScheduleError
from celery_routines.schedules.base import Schedule
from celery_routines.schedules.bounds import bounded
from celery_routines.schedules.calendar import calendar, parse_shift
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.exclusions import Exclusions, exclusion_entries
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.oneoff import OneOffSchedule
from celery_routines.schedules.rrule import RRuleSchedule, looks_like_rrule
from celery_routines.schedules.solar import SolarSchedule
from celery_routines.schedules.union import EpochGridSchedule, UnionSchedule, spec_list

__all__ = [
    "check_one_kind",
    "crontab_to_cron",
    "parse_schedule",
    "parse_specs",
    "schedule_from_columns",
    "schedule_of",
]


def parse_schedule(value: object, timezone: str) -> Schedule:
    """A :class:`Schedule` for ``value``, reading cron fields in ``timezone``.

    A Celery ``crontab`` that carries its own ``tz`` keeps it. Anything else
    raises :class:`ScheduleError` naming the type and the value.
    """
    if isinstance(value, CronSchedule | IntervalSchedule | OneOffSchedule | SolarSchedule):
        return value
    if isinstance(value, solar):
        return SolarSchedule(value.event, value.lat, value.lon)
    # bool is an int subclass: `routine(True)` is a mistake, not one second.
    if isinstance(value, bool):
        raise _unsupported(value)
    if isinstance(value, RRuleSchedule):
        return value
    if isinstance(value, str) and looks_like_rrule(value):
        return RRuleSchedule(value, timezone)
    if isinstance(value, str):
        if _is_number(value):
            raise ScheduleError(
                f"schedule {value!r} is a string: pass a number or a timedelta for an "
                "interval in seconds, or a 5-field cron expression"
            )
        return CronSchedule(value, timezone)
    if isinstance(value, timedelta):
        return IntervalSchedule(value.total_seconds())
    if isinstance(value, int | float):
        return IntervalSchedule(value)
    if isinstance(value, crontab):
        return CronSchedule(crontab_to_cron(value), _crontab_zone(value) or timezone)
    if isinstance(value, schedule):
        # `relative=True` (round to the interval's resolution) has no meaning
        # here: our windows are anchored on the previous window.
        return IntervalSchedule(value.run_every.total_seconds())
    raise _unsupported(value)


def schedule_from_columns(
    cron: str | None,
    interval_seconds: float | None,
    timezone: str,
    *,
    at: datetime | None = None,
    solar: str | None = None,
    starts_at: datetime | None = None,
    ends_at: datetime | None = None,
    rrule: str | None = None,
    schedules: object = None,
    exclude: object = None,
    shift: str | None = None,
) -> Schedule:
    """The schedule of a stored row; exactly one of ``cron``,
    ``interval_seconds``, ``at``, ``solar``, ``rrule`` and ``schedules`` is
    set; ``exclude`` and ``shift`` apply to its windows (issue 34), and
    ``starts_at`` / ``ends_at`` bound any of them."""
    check_one_kind(cron, interval_seconds, at, solar, rrule, schedules)
    base: Schedule
    if schedules is not None:
        base = UnionSchedule(tuple(_union_member(spec, timezone) for spec in spec_list(schedules)))
    elif cron is not None:
        base = CronSchedule(cron, timezone)
    elif interval_seconds is not None:
        base = IntervalSchedule(interval_seconds)
    elif at is not None:
        base = OneOffSchedule(at)
    elif rrule is not None:
        base = RRuleSchedule(rrule, timezone)
    else:
        assert solar is not None  # narrowed by the check above
        base = SolarSchedule.from_spec(solar)
    if exclude is not None or shift is not None:
        entries = exclusion_entries(exclude)
        base = calendar(
            base, Exclusions(entries) if entries else None, parse_shift(shift), timezone
        )
    return bounded(base, starts_at, ends_at)


def parse_specs(value: object, timezone: str) -> list[str | float]:
    """``schedule=[...]`` as the ``schedules`` column stores it: each spec
    validated and written as text (a cron expression, an rrule) or seconds."""
    specs: list[str | float] = []
    for item in value if isinstance(value, list | tuple) else spec_list(value):
        parsed = parse_schedule(item, timezone)
        if isinstance(parsed, CronSchedule):
            if parsed.timezone != timezone:
                raise ScheduleError(
                    f"a crontab with its own zone ({parsed.timezone}) cannot be part of a list: "
                    "every spec of a routine is read in the routine's timezone"
                )
            specs.append(parsed.expression)
        elif isinstance(parsed, IntervalSchedule):
            specs.append(parsed.seconds)
        elif isinstance(parsed, RRuleSchedule):
            specs.append(parsed.rule)
        else:
            raise ScheduleError(
                f"a list of schedules takes crons, intervals and rrules; got {parsed.describe()}"
            )
    UnionSchedule(tuple(_union_member(spec, timezone) for spec in specs))  # the count
    if len(set(specs)) != len(specs):
        raise ScheduleError(f"a list of schedules names the same spec twice: {specs!r}")
    return specs


def _union_member(spec: str | float, timezone: str) -> Schedule:
    if isinstance(spec, str):
        return (
            RRuleSchedule(spec, timezone)
            if looks_like_rrule(spec)
            else CronSchedule(spec, timezone)
        )
    return EpochGridSchedule(IntervalSchedule(spec))


def check_one_kind(
    cron: str | None,
    interval_seconds: float | None,
    at: datetime | None,
    solar: str | None,
    rrule: str | None = None,
    schedules: object = None,
) -> None:
    """Exactly one schedule kind is set; the same words for a declaration and a row."""
    kinds = {
        "cron": cron,
        "interval_seconds": interval_seconds,
        "at": at,
        "solar": solar,
        "rrule": rrule,
        "schedules": schedules,
    }
    given = {name: value for name, value in kinds.items() if value is not None}
    if len(given) != 1:
        shown = ", ".join(
            f"{name}={value.isoformat() if isinstance(value, datetime) else repr(value)}"
            for name, value in given.items()
        )
        raise ScheduleError(
            "set exactly one of cron, interval_seconds, at, solar, rrule or schedules "
            f"(got {shown or 'none'})"
        )


# Schedules are frozen: routines with the same schedule columns share one.
# Bounded, like the cron answers; only schedules without instants are kept
# (two readings of a repeated local hour compare equal as Python datetimes).
SHARED_SCHEDULES_SIZE = 1024
_shared_schedules: dict[tuple[object, ...], Schedule] = {}


def schedule_of(row: Any, timezone: str) -> Schedule:
    """The schedule of a ``routines`` row or a :class:`Routine` (its columns as attributes)."""
    at = getattr(row, "at", None)
    starts_at = getattr(row, "starts_at", None)
    ends_at = getattr(row, "ends_at", None)
    solar = getattr(row, "solar", None)
    rrule = getattr(row, "rrule", None)
    # issue 34: a Routine holds tuples, a row the stored text
    calendar_columns: dict[str, Any] = {
        "schedules": _column_text(getattr(row, "schedules", None)),
        "exclude": _column_text(getattr(row, "exclude", None)),
        "shift": getattr(row, "shift", None),
    }
    cron, interval = row.cron, row.interval_seconds
    if at is not None or starts_at is not None or ends_at is not None:
        return schedule_from_columns(
            cron,
            interval,
            timezone,
            at=at,
            solar=solar,
            starts_at=starts_at,
            ends_at=ends_at,
            rrule=rrule,
            **calendar_columns,
        )
    key = (cron, interval, type(interval), timezone, solar, rrule, *calendar_columns.values())
    found = _shared_schedules.get(key)
    if found is None:
        found = schedule_from_columns(
            cron, interval, timezone, solar=solar, rrule=rrule, **calendar_columns
        )
        if len(_shared_schedules) >= SHARED_SCHEDULES_SIZE:
            _shared_schedules.clear()
        _shared_schedules[key] = found
    return found


def _column_text(value: str | Iterable[object] | None) -> str | None:
    """A list option (``schedules``, ``exclude``) as its column's JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(list(value)) if value else None


def _unsupported(value: object) -> ScheduleError:
    return ScheduleError(
        f"cannot use {type(value).__name__} {value!r} as a schedule: expected a 5-field cron "
        "string, a timedelta, a number of seconds, a celery crontab/schedule/solar, or at=..."
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# -- Celery crontab -> cron string -------------------------------------------

# (attribute holding Celery's expanded set, attribute with the original spec,
#  the full range of values, cron field name)
_CRONTAB_FIELDS = (
    ("minute", "_orig_minute", range(60), "minute"),
    ("hour", "_orig_hour", range(24), "hour"),
    ("day_of_month", "_orig_day_of_month", range(1, 32), "day-of-month"),
    ("month_of_year", "_orig_month_of_year", range(1, 13), "month"),
    ("day_of_week", "_orig_day_of_week", range(7), "day-of-week"),
)


def crontab_to_cron(value: crontab) -> str:
    """The 5-field cron expression that fires when ``value`` would.

    Each field keeps the user's spelling when croniter reads it as the same set
    Celery does; otherwise it is written as Celery's expanded list. Celery
    fires only on days matching BOTH day-of-month and day-of-week, while cron
    fires when EITHER matches, so a crontab restricting both is refused.
    """
    fields: list[str] = []
    for expanded_attr, orig_attr, full, _name in _CRONTAB_FIELDS:
        wanted = set(getattr(value, expanded_attr))
        original = getattr(value, orig_attr, "*")
        if wanted == set(full) and expanded_attr in ("day_of_month", "day_of_week"):
            # A full day field must be '*': cron ORs restricted day fields.
            fields.append("*")
        elif isinstance(original, str | int) and not isinstance(original, bool):
            fields.append(str(original).strip().replace(" ", ""))
        else:
            fields.append(_compact(wanted))
    for index, (expanded_attr, _orig, full, _name) in enumerate(_CRONTAB_FIELDS):
        if _croniter_set(fields, index, full) != set(getattr(value, expanded_attr)):
            fields[index] = _compact(set(getattr(value, expanded_attr)))
    if fields[2] != "*" and fields[4] != "*":
        raise ScheduleError(
            f"cannot convert {value!r}: Celery fires only on days matching both "
            f"day_of_month={value._orig_day_of_month!r} and "
            f"day_of_week={value._orig_day_of_week!r}, a cron expression fires when either "
            "matches; restrict only one of them, or write the cron expression yourself"
        )
    return " ".join(fields)


def _croniter_set(fields: list[str], index: int, full: range) -> set[int] | None:
    """How croniter reads field ``index`` of ``fields``; None if it cannot."""
    probe = ["*"] * 5
    probe[index] = fields[index]
    try:
        expanded = croniter.expand(" ".join(probe))[0][index]
    except Exception:  # croniter raises several unrelated types for bad input
        return None
    if expanded == ["*"]:
        return set(full)
    return {int(v) % 7 if index == 4 else int(v) for v in expanded}


def _compact(values: Iterable[int]) -> str:
    """``{1, 2, 3, 5}`` -> ``'1-3,5'``."""
    ordered = sorted(values)
    parts: list[str] = []
    start = prev = ordered[0]
    for v in [*ordered[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def _crontab_zone(value: crontab) -> str | None:
    """The IANA name of a zone set on the crontab itself, if any.

    Celery 5.7's ``crontab`` takes no ``tz`` argument; ``tz`` is a cached
    property that reads ``app.timezone``. A zone counts as the crontab's own
    only when it was assigned to the instance (``c.tz = ZoneInfo(...)``) or a
    subclass overrides ``tz``. We never evaluate the cached property itself: it
    would reach for the current app.
    """
    if "tz" in vars(value):
        zone = vars(value)["tz"]
    elif type(value).tz is not BaseSchedule.tz:
        zone = value.tz
    else:
        return None
    return _zone_name(zone, value)


def _zone_name(zone: object, value: crontab) -> str | None:
    if zone is None:
        return None
    if isinstance(zone, str):
        return zone
    if isinstance(zone, ZoneInfo):
        return zone.key
    if zone is UTC:
        return "UTC"
    name = getattr(zone, "zone", None)  # pytz zones
    if isinstance(name, str):
        return name
    if isinstance(zone, tzinfo) and zone.utcoffset(None) == timedelta(0):
        return "UTC"
    raise ScheduleError(
        f"cannot read the time zone {zone!r} of {value!r}: give the crontab a "
        "zoneinfo.ZoneInfo, or pass timezone='Europe/Rome' (an IANA name) to the routine"
    )
