"""What a routine's ``exclude`` option removes: dates, date ranges, crons and
public holiday calendars (issue 34).

An entry is one of::

    "2026-12-25"               a date in the routine's zone
    "2026-08-10..2026-08-21"   a range of dates, both ends included
    "* * 24 12 *"              a cron: a window whose wall-clock minute it matches
    "holidays:IT"              a country's public holidays (the ``holidays`` extra)
    "holidays:US-NY"           ... with a subdivision (state, region)

Dates, ranges and holidays exclude *whole local days*: with ``shift`` those
days are not business days and a window on them moves (see
:mod:`celery_routines.schedules.calendar`). A cron excludes *instants*: the
windows it matches are dropped, shift or not.

Holiday calendars come from the ``holidays`` package, imported only when an
entry names one; no table of holidays is shipped here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from typing import Any

from celery_routines.errors import ScheduleError
from celery_routines.schedules.cronspec import parse_cron

__all__ = ["HOLIDAYS_PREFIX", "Exclusions", "exclusion_entries"]

HOLIDAYS_PREFIX = "holidays:"
# Separators of several entries written in one string (a column typed by hand,
# a CLI value): a cron field can hold commas, so never a comma.
_SEPARATORS = re.compile(r"[;\n]")
_RANGE = ".."
# A year's worth of entries is plenty; a longer list is almost certainly a
# generated table of holidays that the holidays extra already knows.
MAX_ENTRIES = 400


def exclusion_entries(value: object) -> tuple[str, ...]:
    """The entries of an ``exclude`` value as written: ``None``, one string
    (entries separated by ``;`` or new lines), a JSON list (a stored column),
    or a list of strings and dates. Not validated yet (see :class:`Exclusions`)."""
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise ScheduleError(
                    f"exclude is not a valid JSON list ({exc}): {value!r}"
                ) from None
        else:
            return tuple(part.strip() for part in _SEPARATORS.split(text) if part.strip())
    if isinstance(value, date):
        value = [value]
    if isinstance(value, bytes) or not isinstance(value, Sequence):
        raise ScheduleError(
            f"exclude must be a string or a list of dates, ranges, crons and holidays:CC, "
            f"got {value!r}"
        )
    entries: list[str] = []
    for item in value:
        if isinstance(item, date):
            entries.append(item.isoformat()[:10])
        elif isinstance(item, str) and item.strip():
            entries.append(" ".join(item.split()))
        else:
            raise ScheduleError(
                f"exclude entry {item!r} is not a date (YYYY-MM-DD), a range "
                "(YYYY-MM-DD..YYYY-MM-DD), a cron or holidays:CC"
            )
    return tuple(entries)


@dataclass(frozen=True)
class Exclusions:
    """The parsed ``exclude`` entries. Validated when built; the zone they are
    read in is the schedule's (:class:`~celery_routines.schedules.calendar.CalendarSchedule`)."""

    entries: tuple[str, ...]
    dates: frozenset[date] = field(init=False, repr=False, compare=False)
    ranges: tuple[tuple[date, date, str], ...] = field(init=False, repr=False, compare=False)
    crons: tuple[str, ...] = field(init=False, repr=False, compare=False)
    holidays: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        entries = exclusion_entries(self.entries)
        if len(entries) > MAX_ENTRIES:
            raise ScheduleError(
                f"exclude has {len(entries)} entries; at most {MAX_ENTRIES}: use date ranges "
                "(A..B) or a holidays:CC calendar"
            )
        dates: set[date] = set()
        ranges: list[tuple[date, date, str]] = []
        crons: list[str] = []
        calendars: list[str] = []
        for entry in entries:
            if entry.lower().startswith(HOLIDAYS_PREFIX):
                code = entry[len(HOLIDAYS_PREFIX) :].strip().upper()
                holiday_calendar(code)  # an unknown country fails here, not at a tick
                calendars.append(code)
            elif _RANGE in entry:
                start_text, _, end_text = entry.partition(_RANGE)
                start, end = _date(entry, start_text), _date(entry, end_text)
                if end < start:
                    raise ScheduleError(
                        f"exclude range {entry!r} ends before it starts: "
                        "write the earlier date first"
                    )
                ranges.append((start, end, f"{start.isoformat()}..{end.isoformat()}"))
            elif entry[:1].isdigit() and len(entry.split()) == 1:
                dates.add(_date(entry, entry))
            else:
                try:
                    crons.append(parse_cron(entry).expression)
                except ScheduleError as exc:
                    raise ScheduleError(
                        f"exclude entry {entry!r} is not a date (YYYY-MM-DD), a range "
                        f"(YYYY-MM-DD..YYYY-MM-DD), holidays:CC or a valid cron: {exc}"
                    ) from None
        object.__setattr__(self, "entries", entries)
        object.__setattr__(self, "dates", frozenset(dates))
        object.__setattr__(self, "ranges", tuple(ranges))
        object.__setattr__(self, "crons", tuple(crons))
        object.__setattr__(self, "holidays", tuple(calendars))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def day_name(self, day: date) -> str | None:
        """Why the local date ``day`` is excluded as a whole day (the holiday's
        name, the date, the range), or None when it is not."""
        for code in self.holidays:
            name = holiday_calendar(code).get(day)
            if name is not None:
                return str(name)
        if day in self.dates:
            return day.isoformat()
        for start, end, text in self.ranges:
            if start <= day <= end:
                return text
        return None

    def as_json(self) -> str | None:
        """The stored column: a JSON list of the entries, None when empty."""
        return json.dumps(list(self.entries)) if self.entries else None


def _date(entry: str, text: str) -> date:
    try:
        return date.fromisoformat(text.strip())
    except ValueError as exc:
        raise ScheduleError(
            f"exclude entry {entry!r}: {text.strip()!r} is not a date (YYYY-MM-DD): {exc}"
        ) from None


@lru_cache(maxsize=64)
def holiday_calendar(code: str) -> Any:
    """The ``holidays`` calendar of ``CC`` or ``CC-SUBDIV`` (years filled in as
    they are asked for). Imported here only: a base install never needs it."""
    try:
        import holidays
    except ImportError:
        raise ScheduleError(
            f"exclude 'holidays:{code}' needs the holidays library: "
            "pip install 'celery-routines[holidays]'"
        ) from None
    country, _, subdivision = code.partition("-")
    try:
        calendar = holidays.country_holidays(country, subdiv=subdivision or None)
        # Names in English wherever the calendar has them: otherwise the
        # library picks the language from LANGUAGE/LC_ALL/LANG, so a beat, a
        # panel and a CLI on differently configured hosts would name the same
        # excluded day differently (Python 3.12 reads C.UTF-8 as no language
        # at all and gets the country's own: "Natale" for IT).
        if "en_US" in calendar.supported_languages:
            calendar = holidays.country_holidays(
                country, subdiv=subdivision or None, language="en_US"
            )
        return calendar
    except NotImplementedError as exc:
        # The library says which part it does not know ("Country XX not
        # available", "Entity `US` does not have subdivision ZZ").
        raise ScheduleError(
            f"exclude 'holidays:{code}': {exc}; write holidays:CC or holidays:CC-SUBDIV with "
            "an ISO 3166 country code (IT, US-NY, GB-SCT)"
        ) from None
