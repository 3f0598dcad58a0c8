"""Parsing and validating 5-field cron expressions; calendar-day matching.

croniter does the parsing and the day matching (day-of-month, month and
day-of-week with their ``L``, ``W`` and ``#`` extensions and the usual rule
that a restricted day-of-month OR a restricted day-of-week matches). We only
ever hand croniter *naive* dates, where it is plain calendar arithmetic: its
aware-datetime iteration gets fixed-hour crons wrong across DST (it fires
``30 2 * * *`` twice in Rome on 2026-10-25 and at 03:00 instead of 03:30 on
2026-03-29; see FIELD-NOTES "Time"), so the DST rules live in ``cron.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from functools import lru_cache

from croniter import CroniterBadDateError, CroniterError, croniter

from celery_routines.errors import ScheduleError

__all__ = ["CronSpec", "dates_matching", "days_from", "days_until", "parse_cron"]

_EXPECTED = "expected 5 fields: minute hour day-of-month month day-of-week"
# (name, lowest, highest, names also accepted) of each field, in order. croniter
# also reads 7 as Sunday.
_FIELDS = (
    ("minute", 0, 59, ""),
    ("hour", 0, 23, ""),
    ("day-of-month", 1, 31, ", L, nW"),
    ("month", 1, 12, " or jan-dec"),
    ("day-of-week", 0, 7, " or sun-sat, n#k, nL"),
)

# The '@' shorthands teams paste from crontabs. They are kept as written (the
# database shows '@daily'), and read as the fields below. 'R' (random) and 'H'
# (hashed) fields are refused: not deterministic without a seed we do not store.
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_RANDOM_OR_HASHED = re.compile(r"(?<![a-z])[hr](?![a-z])", re.IGNORECASE)


@dataclass(frozen=True)
class CronSpec:
    """A validated cron expression, split into what ``cron.py`` needs."""

    expression: str
    """The expression with its whitespace normalised to single spaces."""
    minutes_of_day: tuple[int, ...]
    """Ascending ``hour * 60 + minute`` of every matching time of day."""
    minutes_by_hour: tuple[tuple[int, tuple[int, ...]], ...]
    """``minutes_of_day`` grouped by hour: ``((hour, (minute of day, ...)), ...)``."""
    real_time: bool
    """True when the hour field is a wildcard or a step (or covers all 24 hours)."""
    day_expression: str
    """``0 0 <day-of-month> <month> <day-of-week>``: matches the firing dates."""


def _invalid(expression: object, problem: str) -> ScheduleError:
    return ScheduleError(f"cron expression {expression!r} is invalid: {problem}")


def _diagnose(fields: list[str], read: list[str], error: BaseException | None) -> str:
    """Which field croniter refused, and why. Only on failure: a tick parses
    the cron of every due routine, and the per-field probes cost five more
    croniter parses. ``read`` is how croniter spells ``fields``."""
    for index, field in enumerate(fields):
        problem = _field_problem(index, field, read[index])
        if problem is not None:
            return problem
    reason = (str(error) or type(error).__name__) if error is not None else "croniter rejects it"
    return f"{reason}; {_EXPECTED}"


def _field_problem(index: int, field: str, read: str) -> str | None:
    """What is wrong with field ``index`` on its own (the others wildcards),
    in the user's terms: ``minute field '61' is out of range 0-59``."""
    name, low, high, names = _FIELDS[index]
    probe = ["*"] * 5
    probe[index] = read
    try:
        croniter.expand(" ".join(probe))
    except (CroniterError, ValueError, TypeError, KeyError, IndexError):
        pass
    else:
        return None
    for part in field.split(","):
        base, _, step = part.partition("/")
        for value in base.split("-"):
            if value.isdigit() and not low <= int(value) <= high:
                where = "" if value == field else f": {value}"
                return f"{name} field {field!r}{where} is out of range {low}-{high}"
        if step.isdigit() and int(step) == 0:
            return f"{name} field {field!r} has a step of 0, which never advances"
    return (
        f"{name} field {field!r} is not valid: write numbers {low}-{high}{names}, "
        "ranges (a-b), lists (a,b) or steps (*/n)"
    )


def parse_cron(expression: str) -> CronSpec:
    """Validate ``expression`` and split it; :class:`ScheduleError` if unusable."""
    if not isinstance(expression, str):
        raise _invalid(expression, f"expected a string, got {type(expression).__name__}")
    return _parse_cron(expression)


# Beat parses every claimed routine's cron at every tick: 100,000 routines of
# one "* * * * *" parsed it 100,000 times a minute (a quarter of beat's CPU).
# A CronSpec is immutable; an invalid expression raises and is not cached.
@lru_cache(maxsize=4096)
def _parse_cron(expression: str) -> CronSpec:
    fields = expression.split()
    alias = fields[0].lower() if len(fields) == 1 else None
    if alias is not None and alias.startswith("@"):
        if alias not in ALIASES:
            raise _invalid(expression, f"unknown alias {fields[0]!r}; known: {', '.join(ALIASES)}")
        return _spec(expression, alias, ALIASES[alias].split(), ALIASES[alias].split())
    if len(fields) != 5:
        # Six fields is most often a seconds field from another cron dialect.
        seconds = "; a seconds field is not supported" if len(fields) == 6 else ""
        raise _invalid(expression, f"it has {len(fields)} fields, {_EXPECTED}{seconds}")
    normalised = " ".join(fields)
    if _RANDOM_OR_HASHED.search(normalised):
        raise _invalid(expression, "random (R) and hashed (H) fields are not supported")
    return _spec(expression, normalised, fields, [*fields[:4], _croniter_weekdays(fields[4])])


def _croniter_weekdays(field: str) -> str:
    """The day-of-week field as croniter spells it: Quartz's ``5L`` (the last
    Friday of the month), which teams paste, is croniter's ``L5``."""
    return _LAST_WEEKDAY.sub(lambda m: f"L{_weekday_number(m.group(1))}", field)


_LAST_WEEKDAY = re.compile(r"(?<![\w#])([0-7]|sun|mon|tue|wed|thu|fri|sat)L(?![\w#])", re.I)
_WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _weekday_number(token: str) -> int:
    return int(token) if token.isdigit() else _WEEKDAY_NAMES.index(token.lower())


def _spec(expression: str, normalised: str, fields: list[str], read: list[str]) -> CronSpec:
    """The spec of ``expression`` (kept as ``normalised``), whose fields as
    written are ``fields`` and as croniter reads them ``read``."""
    try:
        valid = croniter.is_valid(" ".join(read))
        expanded, _nth = croniter.expand(" ".join(read))
    except (CroniterError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise _invalid(expression, _diagnose(fields, read, exc)) from exc
    if not valid:
        raise _invalid(expression, _diagnose(fields, read, None))

    minutes = range(60) if expanded[0] == ["*"] else sorted(int(m) for m in expanded[0])
    hours = range(24) if expanded[1] == ["*"] else sorted(int(h) for h in expanded[1])
    hour_field = fields[1]
    # "0-23" is a wildcard in all but spelling; treat it like "*".
    real_time = "*" in hour_field or "/" in hour_field or len(set(hours)) == 24
    spec = CronSpec(
        expression=normalised,
        minutes_of_day=tuple(h * 60 + m for h in hours for m in minutes),
        minutes_by_hour=tuple((h, tuple(h * 60 + m for m in minutes)) for h in hours),
        real_time=real_time,
        day_expression=f"0 0 {read[2]} {read[3]} {read[4]}",
    )
    if next(days_from(spec, date(2000, 1, 1)), None) is None:
        raise _invalid(
            expression,
            f"it never fires (day-of-month {fields[2]!r} never occurs in month {fields[3]!r})",
        )
    return spec


def days_from(spec: CronSpec, first: date) -> Iterator[date]:
    """Matching calendar dates ``>= first``, ascending (ends only near year 9999)."""
    return dates_matching(spec.day_expression, first)


def dates_matching(day_expression: str, first: date) -> Iterator[date]:
    """The dates ``>= first`` that a spec's ``day_expression`` matches."""
    # croniter's get_next is strictly after its start: start one second earlier.
    start = datetime.combine(first, time()) - timedelta(seconds=1)
    walker = croniter(day_expression, start, ret_type=datetime)
    yield from _dates(walker.get_next)


def days_until(spec: CronSpec, last: date) -> Iterator[date]:
    """Matching calendar dates ``<= last``, descending (ends only near year 1)."""
    try:
        start = datetime.combine(last + timedelta(days=1), time())
    except OverflowError:
        start = datetime.combine(last, time(23, 59))
    walker = croniter(spec.day_expression, start, ret_type=datetime)
    yield from _dates(walker.get_prev)


def _dates(step: Callable[[type[datetime]], datetime]) -> Iterator[date]:
    """The dates of the matches ``step`` walks to (croniter's get_next or
    get_prev), until it finds none."""
    while True:
        try:
            found = step(datetime)
        except (CroniterBadDateError, OverflowError, ValueError):
            # No match within croniter's 50-year search, or the calendar ran out.
            return
        yield found.date()
