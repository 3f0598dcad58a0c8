"""Exclusions and business-day shifts over any schedule (issue 34).

``CalendarSchedule(inner, exclusions, shift, timezone)`` answers the Schedule
protocol with the inner schedule's windows, less those the exclusions remove:

* without ``shift``, a window on an excluded day or matched by an excluded
  cron is not a window at all: ``next_after``, ``windows``, a preview and the
  panel skip it;
* with ``shift="next_business_day"`` / ``"previous_business_day"``, a window
  whose local date is not a business day (Saturday, Sunday, or a day excluded
  by a date, a range or a holiday calendar) moves to the next / previous
  business day at the same wall time, which becomes an instant by the
  contract's fixed-hour rule (a time in a spring gap slides by the gap, a
  repeated time is its first pass). A window matched by an excluded cron is
  still dropped: crons remove instants, not days. A moved window that lands on
  a window the business day has anyway fires once.

Moving windows backwards reorders them, so the shifted stream is built per
business day with the same look-ahead heap as ``cron.py``'s stream. Dates are
local dates in the schedule's zone. Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo

from celery_routines.errors import ScheduleError
from celery_routines.schedules.base import NEVER, ONE_MICROSECOND, Schedule, first_window, is_never
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.exclusions import Exclusions
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.rrule import RRuleSchedule
from celery_routines.schedules.union import UnionSchedule
from celery_routines.schedules.zones import aware_utc, load_zone, local_to_utc_first

__all__ = ["CalendarSchedule", "Shift", "calendar", "nominal_walls", "parse_shift"]

_DAY = timedelta(days=1)
# Around a local date, the instants whose wall clock reads that date (a date
# lasts at most 26 hours, and a gap shift moves a time by at most a day).
_AROUND = timedelta(hours=26)
# The most windows in a row the exclusions may remove, and the most days
# without a business day, before the routine is told its calendar is empty.
MAX_REMOVED = 10_000
HORIZON = timedelta(days=3660)
MAX_NON_BUSINESS_DAYS = 366
MAX_IDLE_DAYS = 3660
# Under a shift, each day whose windows are looked at costs a millisecond or
# two (the inner schedule is asked about the days around it): 100 business
# days in a row that had windows and kept none mean the exclusions remove
# them all (a season off is written as a date range, which costs nothing).
MAX_EMPTIED_DAYS = 100
WEEKEND = frozenset({5, 6})  # date.weekday(): Saturday, Sunday


class Shift(StrEnum):
    NEXT_BUSINESS_DAY = "next_business_day"
    PREVIOUS_BUSINESS_DAY = "previous_business_day"


def parse_shift(value: object) -> Shift | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value in Shift._value2member_map_:
        return Shift(value)
    raise ScheduleError(
        f"shift must be 'next_business_day' or 'previous_business_day' (or unset), got {value!r}"
    )


@dataclass(frozen=True)
class CalendarSchedule:
    inner: Schedule
    exclusions: Exclusions
    shift: Shift | None
    timezone: str
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _crons: tuple[CronSchedule, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_zone", load_zone(self.timezone))
        crons = tuple(CronSchedule(text, self.timezone) for text in self.exclusions.crons)
        object.__setattr__(self, "_crons", crons)
        for cron in crons:
            if cron.matches_every_minute:
                raise ScheduleError(
                    f"exclude cron {cron.expression!r} matches every minute: it removes every "
                    f"window of {self.inner.describe()}, which would never fire"
                )
        if self.shift is not None and isinstance(self.inner, IntervalSchedule):
            # An interval is anchored on its previous window: moving one would
            # move every later one. Days are a calendar's; write a cron.
            raise ScheduleError(
                f"shift={self.shift.value!r} moves calendar windows; an interval has none "
                "(write a cron such as '0 9 25 * *')"
            )

    def describe(self) -> str:
        text = self.inner.describe()
        if self.exclusions:
            text += f" except {', '.join(self.exclusions.entries)}"
        if self.shift is not None:
            text += f", moved to the {self.shift.value.replace('_', ' ')}"
        return text

    # -- what a day and an instant are ---------------------------------------------

    def local_date(self, instant: datetime) -> date:
        return instant.astimezone(self._zone).date()

    def business_day(self, day: date) -> bool:
        return day.weekday() not in WEEKEND and self.exclusions.day_name(day) is None

    def cron_removes(self, window: datetime) -> CronSchedule | None:
        """The excluded cron matching ``window``'s wall-clock minute, if any."""
        if not self._crons:
            return None
        minute = window.replace(second=0, microsecond=0)
        for cron in self._crons:
            if cron.fires_at(minute):
                return cron
        return None

    def why_not(self, window: datetime) -> str | None:
        """Why the inner schedule's ``window`` does not fire as it is (the
        holiday's name, the excluded date or range, the cron, or the weekend
        under a shift), or None when it fires."""
        cron = self.cron_removes(window)
        if cron is not None:
            return f"cron {cron.expression!r}"
        day = self.local_date(window)
        name = self.exclusions.day_name(day)
        if name is None and self.shift is not None and day.weekday() in WEEKEND:
            name = day.strftime("%A")
        return name

    def next_excluded(self, after: datetime, limit: int = 5_000) -> tuple[datetime, str] | None:
        """The first window of the inner schedule after ``after`` that is
        excluded or moved, and why (for ``show`` and the panel)."""
        after = aware_utc(after, "after")
        for examined, window in enumerate(self.inner.windows(after, after + HORIZON)):
            if examined >= limit:
                break
            reason = self.why_not(window)
            if reason is not None:
                return window, reason
        return None

    def moved_from(self, window: datetime) -> tuple[datetime, str] | None:
        """The inner window a shifted ``window`` stands in for, and why it
        moved (a note for ``preview`` and ``show``); None for a window that
        fires where the inner schedule put it."""
        if self.shift is None:
            return None
        day = self.local_date(window)
        wall = window.astimezone(self._zone).replace(tzinfo=None).time()
        for source in self._sources(day)[1:] if self.business_day(day) else ():
            original = local_to_utc_first(datetime.combine(source, wall), self._zone)
            fires = self.inner.next_after(original - ONE_MICROSECOND) == original
            if fires and self.cron_removes(original) is None:
                return original, self.why_not(original) or "not a business day"
        return None

    def target_day(self, day: date) -> date:
        """The business day a window on ``day`` fires on."""
        step = _DAY if self.shift is Shift.NEXT_BUSINESS_DAY else -_DAY
        found = day
        for _ in range(MAX_NON_BUSINESS_DAYS):
            if self.business_day(found):
                return found
            found += step
        raise ScheduleError(
            f"{self.describe()}: no business day within {MAX_NON_BUSINESS_DAYS} days of "
            f"{day.isoformat()}"
        )

    # -- the Schedule protocol ------------------------------------------------------

    def next_after(self, instant: datetime) -> datetime:
        instant = aware_utc(instant, "instant")
        if self.shift is not None:
            return next(self._shifted(instant), NEVER)
        return self._kept_from(self.inner.next_after(instant), instant)

    def first_window(self, now: datetime) -> datetime:
        if self.shift is not None:
            return self.next_after(now)
        return self._kept_from(first_window(self.inner, now), now)

    def first_from(self, start: datetime) -> datetime:
        return self.next_after(aware_utc(start, "start") - ONE_MICROSECOND)

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        after, until = aware_utc(after, "after"), aware_utc(until, "until")
        if self.shift is not None:
            for window in self._shifted(after):
                if window > until:
                    return
                yield window
            return
        for window in self.inner.windows(after, until):
            if self.why_not(window) is None:
                yield window

    # -- exclusions alone: skip forward ----------------------------------------------

    def _kept_from(self, window: datetime, asked: datetime) -> datetime:
        """``window`` or the first inner window after it that is not excluded.
        A whole excluded day is jumped over in one question to the inner
        schedule (an interval keeps its grid); windows an excluded cron
        removes are listed, not asked for one by one (a cron's ``next_after``
        costs milliseconds, a listed window microseconds)."""
        listed: Iterator[datetime] | None = None
        for _ in range(MAX_REMOVED):
            if is_never(window):
                return window
            if window - asked > HORIZON:
                break
            cron = self.cron_removes(window)
            if cron is None and self.exclusions.day_name(self.local_date(window)) is None:
                return window
            if cron is not None:
                listed = listed or self._inner_after(window)
                window = next(listed)
                continue
            end = self._day_start(self._last_excluded_day(self.local_date(window)) + _DAY)
            window, listed = self._inner_from(window, end), None
        raise ScheduleError(
            f"{self.describe()}: the exclusions remove every window after {asked.isoformat()} "
            f"(looked {MAX_REMOVED} windows or 10 years ahead)"
        )

    def _inner_after(self, window: datetime) -> Iterator[datetime]:
        """The inner windows after ``window``, listed lazily up to the
        horizon, then the first one past it (or :data:`NEVER`)."""
        last = window
        for last in self.inner.windows(window, window + HORIZON):
            yield last
        yield self.inner.next_after(last)

    def _last_excluded_day(self, day: date) -> date:
        while self.exclusions.day_name(day + _DAY) is not None:
            day += _DAY
        return day

    def _inner_from(self, window: datetime, start: datetime) -> datetime:
        """The first inner window at or after ``start``, on the chain ``window`` is on."""
        if isinstance(self.inner, IntervalSchedule):
            steps = -((window - start) // self.inner.step)  # ceil((start - window) / step)
            return window + max(steps, 1) * self.inner.step
        return self.inner.next_after(max(start - ONE_MICROSECOND, window))

    def _day_start(self, day: date) -> datetime:
        """The first instant at which the local wall clock reads ``day`` 00:00
        (or later, for a midnight in a gap)."""
        midnight = datetime.combine(day, time())
        return min(
            midnight.replace(tzinfo=self._zone, fold=0).astimezone(UTC),
            midnight.replace(tzinfo=self._zone, fold=1).astimezone(UTC),
        )

    # -- shift: windows per business day --------------------------------------------

    def _sources(self, day: date) -> list[date]:
        """The days whose windows fire on business day ``day``: itself, and the
        non-business days right after it (previous) or right before it (next)."""
        step = -_DAY if self.shift is Shift.NEXT_BUSINESS_DAY else _DAY
        found = [day]
        other = day + step
        while len(found) <= MAX_NON_BUSINESS_DAYS and not self.business_day(other):
            found.append(other)
            other += step
        return found

    def _instants_of(self, day: date) -> tuple[set[datetime], int]:
        """Every window that fires on business day ``day``, and how many
        windows of its days an excluded cron removed."""
        instants: set[datetime] = set()
        removed = 0
        for source in self._sources(day):
            start = self._day_start(source)
            for window in self.inner.windows(start - _AROUND, start + 2 * _AROUND):
                if self.local_date(window) != source:
                    continue
                if self.cron_removes(window) is not None:
                    removed += 1
                    continue
                if source == day:
                    instants.add(window)
                else:
                    for wall in nominal_walls(self.inner, window, self._zone):
                        moved = datetime.combine(day, wall.time())
                        instants.add(local_to_utc_first(moved, self._zone))
        return instants, removed

    def _shifted(self, after: datetime) -> Iterator[datetime]:
        """Windows strictly after ``after``, ascending; business days in order,
        jumping straight to the day the inner schedule's next window lands on."""
        pending: list[datetime] = []
        last_sent: datetime | None = None
        day = self.local_date(after) - 2 * _DAY
        idle = removed = emptied = 0
        while True:
            idle += 1
            if idle > MAX_IDLE_DAYS or removed > MAX_REMOVED or emptied > MAX_EMPTIED_DAYS:
                raise ScheduleError(
                    f"{self.describe()}: no window found within {MAX_IDLE_DAYS} days of "
                    f"{after.isoformat()} (the exclusions removed {removed} windows of "
                    f"{emptied} days in a row; the limits are {MAX_REMOVED} windows and "
                    f"{MAX_EMPTIED_DAYS} days)"
                )
            if not self.business_day(day):
                day += _DAY
                continue
            earliest = min(self._sources(day))
            upcoming = self.inner.next_after(self._day_start(earliest) - _AROUND)
            if is_never(upcoming):
                break
            lands = self.target_day(self.local_date(upcoming))
            if lands > day:
                day = lands
                continue
            bound = self._day_start(day)
            while pending and pending[0] < bound:
                window = heapq.heappop(pending)
                if window != last_sent:
                    last_sent = window
                    idle = removed = emptied = 0
                    yield window
            instants, dropped = self._instants_of(day)
            removed += dropped
            emptied += 1
            for window in instants:
                if window > after:
                    heapq.heappush(pending, window)
            day += _DAY
        while pending:
            window = heapq.heappop(pending)
            if window != last_sent:
                last_sent = window
                yield window


def nominal_walls(schedule: Schedule, window: datetime, zone: ZoneInfo) -> set[datetime]:
    """The local wall times ``window`` stands for, which a shift moves.

    A fixed hour that a spring gap slid (02:30 firing at 03:30 on the day of
    the change) moves as the time it names: moved to a day without a gap it
    fires at 02:30, not at 03:30 next to that day's own 02:30. A cron and an
    rrule know their wall times; a union asks each spec that fires at
    ``window``; any other schedule moves the wall time it fired at."""
    if isinstance(schedule, CronSchedule | RRuleSchedule):
        walls = set(schedule.nominal_walls(window))
        if walls:
            return walls
    elif isinstance(schedule, UnionSchedule):
        walls = set()
        for spec in schedule.specs:
            if spec.next_after(window - ONE_MICROSECOND) == window:
                walls |= nominal_walls(spec, window, zone)
        if walls:
            return walls
    return {window.astimezone(zone).replace(tzinfo=None)}


def calendar(
    inner: Schedule, exclusions: Exclusions | None, shift: Shift | None, timezone: str
) -> Schedule:
    """``inner`` with its exclusions and shift; itself when it has neither."""
    if not exclusions and shift is None:
        return inner
    return CalendarSchedule(inner, exclusions or Exclusions(()), shift, timezone)
