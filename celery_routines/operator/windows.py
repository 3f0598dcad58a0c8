"""Time for operators: reading the instants they type, and listing the windows
of a schedule over a range (preview, show, backfill; the preview itself is
:mod:`celery_routines.operator.previews`). Pure: "now" is an argument."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from celery_routines.errors import ScheduleError
from celery_routines.operator.views import iso_utc
from celery_routines.schedules.base import Schedule, count_windows, is_never
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.zones import load_zone, local_to_utc_first
from celery_routines.store import RoutineRecord

MAX_PREVIEW = 1000
# Instants an operator may type: a year's margin inside datetime's range, so
# the windows around them (and a microsecond before) can still be computed.
FIRST_INSTANT = datetime(2, 1, 1, tzinfo=UTC)
LAST_INSTANT = datetime(9998, 12, 31, tzinfo=UTC)
ONE_MICROSECOND = timedelta(microseconds=1)
_AGE = re.compile(r"^(\d+)\s*(s|m|h|d|w)$")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_instant(text: str, timezone: str, now: datetime, *, label: str = "date") -> datetime:
    """An instant from what an operator types, as aware UTC.

    ``2026-11-30`` (midnight) and ``2026-11-30T08:00`` are wall times in
    ``timezone``; an explicit offset (``+01:00``, ``Z``) wins; ``now``; an age
    such as ``90m``, ``2h``, ``7d`` or ``1w`` means that long before ``now``.
    """
    raw = text.strip()
    if raw.lower() == "now":
        return now.astimezone(UTC)
    age = _AGE.match(raw.lower())
    if not age:
        try:
            parsed = datetime.fromisoformat(raw.replace(" ", "T", 1))
        except ValueError:
            raise ValueError(
                f"{label} {text!r} is not a date: use ISO 8601 such as 2026-11-30, "
                "2026-11-30T08:00 or 2026-11-30T08:00+01:00, 'now', or an age such as 2h "
                "or 7d"
            ) from None
        return within_calendar(_utc_or_none(parsed, timezone), text, label)
    try:
        instant: datetime | None = now.astimezone(UTC) - timedelta(
            **{_AGE_UNITS[age.group(2)]: int(age.group(1))}
        )
    except OverflowError:
        instant = None
    return within_calendar(instant, text, label)


def _utc_or_none(moment: datetime, timezone: str) -> datetime | None:
    """``moment`` as aware UTC (a naive one is a wall time in ``timezone``),
    or None when that falls outside datetime's range."""
    try:
        if moment.tzinfo is None:
            return local_to_utc_first(moment, load_zone(timezone))
        return moment.astimezone(UTC)
    except OverflowError:
        return None


def within_calendar(instant: datetime | None, text: object, label: str) -> datetime:
    """``instant``, or a ValueError naming ``label`` when it is out of the
    calendar's range (or None: its computation overflowed). The margin lets
    windows be computed on either side of it without overflowing."""
    if instant is None or not FIRST_INSTANT <= instant <= LAST_INSTANT:
        raise ValueError(
            f"{label} {text!r} is out of range: give a date between "
            f"{FIRST_INSTANT.year:04d}-01-01 and {LAST_INSTANT.year:04d}-12-31"
        )
    return instant


def check_count(label: str, value: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ValueError(f"{label} must be a whole number from 1 to {high}, got {value!r}")


def to_instant(value: datetime | str | None, timezone: str, now: datetime, label: str) -> datetime:
    if value is None:
        return now.astimezone(UTC)
    if isinstance(value, str):
        return parse_instant(value, timezone, now, label=label)
    return within_calendar(_utc_or_none(value, timezone), value, label)


def take_windows(schedule: Schedule, after: datetime, n: int) -> list[datetime]:
    found: list[datetime] = []
    current = after
    while len(found) < n:
        current = schedule.next_after(current)
        if is_never(current):
            break  # a one-off that fired, a schedule past its ends_at
        found.append(current)
    return found


def range_windows(
    schedule: Schedule, record: RoutineRecord, first: datetime, last: datetime, cap: int
) -> list[datetime]:
    """The windows in ``[first, last]``, refusing more than ``cap``."""
    try:
        return _range_windows(schedule, record, first, last, cap)
    except OverflowError:
        raise ValueError(
            f"backfill of {record.name!r} from {iso_utc(first)} to {iso_utc(last)}: the "
            "windows of that range cannot be computed (out of the calendar's range)"
        ) from None


def count_range_windows(
    schedule: Schedule, record: RoutineRecord, first: datetime, last: datetime, cap: int
) -> int:
    """How many windows :func:`range_windows` would list, without listing
    them (arithmetic for intervals and crons), with the same checks."""
    try:
        if isinstance(schedule, IntervalSchedule):
            k_first, k_last = _interval_steps(schedule, record, first, last)
            count = max(0, k_last - k_first + 1)
        else:
            count = count_windows(schedule, first - ONE_MICROSECOND, last)
    except OverflowError:
        raise ValueError(
            f"backfill of {record.name!r} from {iso_utc(first)} to {iso_utc(last)}: the "
            "windows of that range cannot be computed (out of the calendar's range)"
        ) from None
    _check_backfill_size(record.name, count, first, last, cap)
    return count


def _interval_steps(
    schedule: IntervalSchedule, record: RoutineRecord, first: datetime, last: datetime
) -> tuple[int, int]:
    anchor = record.next_run_at
    if anchor is None:
        raise ScheduleError(
            "it has no window yet (beat has not adopted it); start beat once, then backfill"
        )
    step = schedule.step
    # ceil((first - anchor) / step), floor((last - anchor) / step)
    return -((anchor - first) // step), (last - anchor) // step


def _range_windows(
    schedule: Schedule, record: RoutineRecord, first: datetime, last: datetime, cap: int
) -> list[datetime]:
    if isinstance(schedule, IntervalSchedule):
        # Interval windows are anchored on the routine's own chain of windows,
        # so the backfilled keys are the ones beat used (or would have used).
        k_first, k_last = _interval_steps(schedule, record, first, last)
        count = max(0, k_last - k_first + 1)
        _check_backfill_size(record.name, count, first, last, cap)
        anchor, step = record.next_run_at, schedule.step
        assert anchor is not None  # _interval_steps refused it otherwise
        return [anchor + k * step for k in range(k_first, k_last + 1)]
    count = count_windows(schedule, first - ONE_MICROSECOND, last)
    _check_backfill_size(record.name, count, first, last, cap)
    return list(schedule.windows(first - ONE_MICROSECOND, last))


def _check_backfill_size(name: str, count: int, first: datetime, last: datetime, cap: int) -> None:
    if count > cap:
        raise ValueError(
            f"backfill of {name!r} from {iso_utc(first)} to {iso_utc(last)} covers {count} "
            f"windows; at most {cap} are sent at once: split the range or raise --max"
        )
