"""Cron schedules read in an IANA time zone, with the contract's DST rules.

How windows are found: croniter (on naive dates only, see ``cronspec.py``)
yields the calendar dates that match the day fields; for each such local date
we list its matching wall times and turn them into instants:

* fixed hours (``30 2 * * *``, ``0 9,17 * * 1-5``): every wall time maps to
  ONE instant with :func:`~celery_routines.schedules.zones.local_to_utc_first`
  (a gap time shifts forward by the gap, a repeated time fires at its first
  occurrence), and instants two wall times share are fired once;
* hour wildcard or step (``*/15 * * * *``): every real instant whose wall
  clock matches, so the repeated autumn hour fires in both passes and a time
  in the spring gap does not exist.

Because of gaps and repeated hours, instants are not in wall-time order near a
transition, so the stream keeps a small look-ahead buffer (see ``_stream``).
Ordinary days (constant offset) take an arithmetic path without zoneinfo
conversions, which is what makes :meth:`CronSchedule.count_windows` and
:meth:`CronSchedule.last_windows` cheap over long outages.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from celery_routines.errors import ScheduleError
from celery_routines.schedules.cronspec import (
    CronSpec,
    dates_matching,
    days_from,
    days_until,
    parse_cron,
)
from celery_routines.schedules.zones import (
    aware_utc,
    instants_of_wall_time,
    load_zone,
    local_to_utc_first,
    steady_offset,
)

__all__ = ["MAX_SPAN_DAYS", "CronSchedule"]

_DAY = timedelta(days=1)
_MINUTE = timedelta(minutes=1)
_HOUR = timedelta(hours=1)

MAX_SPAN_DAYS = 36_600
"""Hard cap on the work of one ``count_windows``/``last_windows`` call.

They walk at most this many calendar days (100 years) of the requested range
and raise :class:`ScheduleError` beyond it. The cost is about 40 microseconds
per matching day plus one list of the day's times for each day they have to
enumerate; a year of ``* * * * *`` counts in about 20 ms.
"""

# Margin in calendar days around a range. A wall clock never jumps by more than
# 24 hours (Pacific/Kwajalein 1993 and Pacific/Apia 2011 skipped a whole day),
# so every window of an instant range lies on a local date within 2 days of the
# local dates of the range's ends.
_MARGIN = 2


@dataclass(frozen=True)
class CronSchedule:
    """A 5-field cron expression read in ``timezone``. Validated when built."""

    expression: str
    timezone: str
    _spec: CronSpec = field(init=False, repr=False, compare=False)
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _minutes: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        spec = parse_cron(self.expression)
        zone = load_zone(self.timezone)
        # Frozen dataclass: store the normalised expression and the parsed
        # parts once, so every later call is free of parsing.
        object.__setattr__(self, "expression", spec.expression)
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_zone", zone)
        object.__setattr__(self, "_minutes", frozenset(spec.minutes_of_day))

    @property
    def real_time(self) -> bool:
        """True when the hour field is a wildcard or step (real-time cadence)."""
        return self._spec.real_time

    @property
    def matches_every_minute(self) -> bool:
        """True for ``* * * * *`` in any spelling (as an exclusion: everything)."""
        return len(self._minutes) == 24 * 60 and self._spec.day_expression == "0 0 * * *"

    def describe(self) -> str:
        return f"cron {self.expression!r} ({self.timezone})"

    # -- the Schedule protocol ---------------------------------------------

    def next_after(self, instant: datetime) -> datetime:
        """The first window strictly after ``instant``."""
        return _next_after(self, aware_utc(instant, "instant"))

    def _next_after(self, instant: datetime) -> datetime:
        for window in self._stream(instant):
            return window
        raise ScheduleError(f"{self.describe()} has no window after {instant.isoformat()}")

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Every window in ``(after, until]``, ascending; lazy."""
        after = aware_utc(after, "after")
        until = aware_utc(until, "until")
        if until <= after:
            return
        for window in self._stream(after):
            if window > until:
                return
            yield window

    def count_windows(self, after: datetime, until: datetime) -> int:
        """How many windows lie in ``(after, until]``, without listing them.

        Days with a constant UTC offset (and neighbours without transitions)
        count ``len(times of day)`` each; the rest are enumerated.
        At most :data:`MAX_SPAN_DAYS` calendar days.
        """
        return _count_windows(self, aware_utc(after, "after"), aware_utc(until, "until"))

    def _count_windows(self, after: datetime, until: datetime) -> int:
        if until <= after:
            return 0
        first, last = self._date_range(after, until)
        per_day = len(self._spec.minutes_of_day)
        counted = 0
        enumerated: set[datetime] = set()
        for day in days_from(self._spec, first):
            if day > last:
                break
            near_end = day - first <= timedelta(days=_MARGIN) or last - day <= timedelta(
                days=_MARGIN
            )
            # A steady span from the day before to the day after means no gap
            # time of a neighbour is shifted into this day and no repeated hour
            # touches it: exactly one instant per time of day, all in range.
            if not near_end and self._steady(day - _DAY, day + 2 * _DAY) is not None:
                counted += per_day
            else:
                enumerated.update(self._day_instants(day, after, until))
        return counted + len(enumerated)

    def last_windows(self, after: datetime, until: datetime, n: int) -> list[datetime]:
        """The newest ``n`` windows in ``(after, until]``, ascending.

        Walks matching days backwards from ``until``, so the work is about
        ``n`` windows plus a few days, never the whole range (bounded by
        :data:`MAX_SPAN_DAYS` calendar days).
        """
        after, until = aware_utc(after, "after"), aware_utc(until, "until")
        return list(_last_windows(self, after, until, n))

    def _last_windows(self, after: datetime, until: datetime, n: int) -> tuple[datetime, ...]:
        if n <= 0 or until <= after:
            return ()
        first, last = self._date_range(after, until)
        found: set[datetime] = set()
        enough_on: date | None = None
        for day in days_until(self._spec, last):
            if day < first:
                break
            # Once n windows are found on days >= enough_on, days more than 3
            # calendar days earlier cannot hold anything newer: their instants
            # are at least 72 wall hours earlier, and offsets move by <= 24 h
            # plus a gap shift of <= 24 h in that time.
            if enough_on is not None and enough_on - day > timedelta(days=3):
                break
            found.update(self._day_instants(day, after, until))
            if enough_on is None and len(found) >= n:
                enough_on = day
        return tuple(sorted(found)[-n:])

    def fires_at(self, instant: datetime) -> bool:
        """Whether ``instant`` is one of the windows, without walking to it
        (``exclude`` crons ask this of every window of a routine)."""
        return bool(self.nominal_walls(instant))

    def nominal_walls(self, instant: datetime) -> tuple[datetime, ...]:
        """The local wall times (naive) the cron names whose window is
        ``instant``: its own wall time, and for a fixed hour slid over a
        spring gap, the time that does not exist (``30 2,3 * * *`` in Rome on
        2026-03-29: 03:30 CEST stands for both 02:30 and 03:30). Empty when
        ``instant`` is not a window. A business-day shift moves these wall
        times, not the slid one (``calendar.py``)."""
        instant = aware_utc(instant, "instant")
        if instant.second or instant.microsecond:
            return ()
        wall = instant.astimezone(self._zone).replace(tzinfo=None)
        found: list[datetime] = []
        # Real time: every instant whose wall clock matches. Fixed hours:
        # only the first pass of a repeated time.
        if self._matches_wall(wall) and (
            self.real_time or local_to_utc_first(wall, self._zone) == instant
        ):
            found.append(wall)
        if self.real_time:
            return tuple(found)
        # A fixed hour that does not exist fires the gap later: is this
        # instant such a shifted time? (The offset 25 hours earlier is the
        # one before any gap that could have shifted a time to here.)
        before = (instant - timedelta(hours=25)).astimezone(self._zone).utcoffset()
        now = instant.astimezone(self._zone).utcoffset()
        if before is None or now is None or now <= before:
            return tuple(found)
        nominal = wall - (now - before)
        if self._matches_wall(nominal) and local_to_utc_first(nominal, self._zone) == instant:
            found.append(nominal)
        return tuple(found)

    def _matches_wall(self, wall: datetime) -> bool:
        return wall.hour * 60 + wall.minute in self._minutes and _day_matches(
            self._spec.day_expression, wall.date()
        )

    # -- internals ----------------------------------------------------------

    def _date_range(self, after: datetime, until: datetime) -> tuple[date, date]:
        first = after.astimezone(self._zone).date() - timedelta(days=_MARGIN)
        last = until.astimezone(self._zone).date() + timedelta(days=_MARGIN)
        if (last - first).days > MAX_SPAN_DAYS:
            raise ScheduleError(
                f"{self.describe()}: cannot plan over {(last - first).days} days "
                f"({after.isoformat()} to {until.isoformat()}); the limit is "
                f"{MAX_SPAN_DAYS} days: move next_run_at closer to now"
            )
        return first, last

    def _steady(self, start: date, end: date) -> timedelta | None:
        return steady_offset(
            self._zone, datetime.combine(start, time()), datetime.combine(end, time())
        )

    def _day_instants(
        self, day: date, after: datetime | None = None, until: datetime | None = None
    ) -> list[datetime]:
        """The windows whose wall time falls on local ``day`` and in ``(after, until]``.

        Ascending and distinct.
        """
        midnight = datetime.combine(day, time())
        minutes = self._spec.minutes_of_day
        offset = self._steady(day, day + _DAY)
        if offset is not None:
            # One constant offset all day: every wall time is one instant, in
            # order, so the range bounds are found by bisection.
            base = (midnight - offset).replace(tzinfo=UTC)
            lo = 0 if after is None else bisect.bisect_right(minutes, (after - base) // _MINUTE)
            hi = (
                len(minutes)
                if until is None
                else bisect.bisect_right(minutes, (until - base) // _MINUTE)
            )
            return [base + timedelta(minutes=m) for m in minutes[lo:hi]]
        # A transition day: hour by hour, arithmetic where the offset holds
        # and zoneinfo only around the transition itself.
        instants: set[datetime] = set()
        for hour, hour_minutes in self._spec.minutes_by_hour:
            start = midnight + timedelta(hours=hour)
            offset = steady_offset(self._zone, start, start + _HOUR)
            if offset is not None:
                base = (midnight - offset).replace(tzinfo=UTC)
                instants.update(base + timedelta(minutes=m) for m in hour_minutes)
                continue
            for m in hour_minutes:
                wall = midnight + timedelta(minutes=m)
                if self._spec.real_time:
                    instants.update(instants_of_wall_time(wall, self._zone))
                else:
                    instants.add(local_to_utc_first(wall, self._zone))
        return sorted(
            w for w in instants if (after is None or w > after) and (until is None or w <= until)
        )

    def _lower_bound(self, day: date) -> datetime:
        """No window of a wall time on or after ``day`` is earlier than this.

        The first instant at which the wall clock reaches ``day`` 00:00 (for a
        midnight inside a gap, fold=1 gives the instant of the transition or
        earlier). Offsets never change twice within days, so the wall clock
        cannot come back below midnight after reaching it.
        """
        midnight = datetime.combine(day, time())
        return min(
            midnight.replace(tzinfo=self._zone, fold=0).astimezone(UTC),
            midnight.replace(tzinfo=self._zone, fold=1).astimezone(UTC),
        )

    def _stream(self, after: datetime) -> Iterator[datetime]:
        """Windows strictly after ``after``, ascending, unbounded.

        Day lists go into a heap and an instant leaves it only once it is below
        the lower bound of the next matching day, so a gap time shifted past
        the next day's first times, or a second pass of a repeated hour, still
        comes out in order and once.
        """
        pending: list[datetime] = []
        last_sent: datetime | None = None
        first = after.astimezone(self._zone).date() - timedelta(days=_MARGIN)
        for day in days_from(self._spec, first):
            bound = self._lower_bound(day)
            while pending and pending[0] < bound:
                window = heapq.heappop(pending)
                if window != last_sent:
                    last_sent = window
                    yield window
            for window in self._day_instants(day, after):
                heapq.heappush(pending, window)
        # The calendar ran out (year 9999): flush what is left.
        while pending:
            window = heapq.heappop(pending)
            if window != last_sent:
                last_sent = window
                yield window


# Beat asks the same questions of every routine that shares a cron expression
# and zone, at the same instants of one tick: 100,000 "* * * * *" routines
# stepped croniter 100,000 times for one answer (45% of beat's CPU). A
# schedule is immutable and compares by (expression, timezone), so answers are
# shared; an error is raised again, never cached.
_ANSWERS = 8192
_next_after = lru_cache(maxsize=_ANSWERS)(CronSchedule._next_after)
_count_windows = lru_cache(maxsize=_ANSWERS)(CronSchedule._count_windows)
_last_windows = lru_cache(maxsize=_ANSWERS)(CronSchedule._last_windows)


# Keyed by the day fields' text, not by the spec: hashing a spec hashes its
# 1,440 minutes of "* * * * *", which made ``fires_at`` cost 0.1 ms (an
# exclusion cron asks it of every window).
@lru_cache(maxsize=_ANSWERS)
def _day_matches(day_expression: str, day: date) -> bool:
    return next(dates_matching(day_expression, day), None) == day
