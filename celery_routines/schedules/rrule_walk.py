"""Walking a dateutil rule in bounded time (for ``rrule.py``).

dateutil answers "the next occurrence" by stepping the rule from its
``DTSTART`` and ends only at an occurrence past ``UNTIL``, at ``COUNT``, or
in the year 9999. So two kinds of rule cost seconds per question:

* a rule with no window left: ``FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=30``
  steps 2.9 million days, one at a time, to the year 9999 (about 15 s);
* a rule that started long ago: ``FREQ=MINUTELY`` from 2020 lists 3.6
  million occurrences to reach 2026 (about 12 s).

A third kind is a minutely or secondly rule whose BY* filters leave days out
(``FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=30;BYHOUR=23``): dateutil steps every
second of each day it then leaves out, minutes per question. Such a rule is
walked a day at a time (:func:`_by_day`), and a BYSETPOS that picks none of
a period's times is refused without a walk.

:func:`restarted_near` answers the second: the same rule restarted at a
point of its own phase shortly before the asked time (the rule restarted
at ``DTSTART + n * INTERVAL`` periods has the same later occurrences).
:func:`bounded_walk` answers the first: it counts the months dateutil moves
through and stops :data:`HORIZON_YEARS` after the asked time, and it lists
at most :data:`MAX_WALKED` occurrences before it.

dateutil rebuilds its masks (``_iterinfo.rebuild``) at least once per month
it enters, and each rebuild reads the rule's ``_byeaster``: the walked copy
counts those reads. That is a private attribute of dateutil (stable since
2.7; the tests pin it: ``tests/schedules/test_rrule_bounds.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from dateutil.rrule import DAILY, HOURLY, MINUTELY, MONTHLY, SECONDLY, WEEKLY, YEARLY, rrule
from dateutil.rrule import weekday as rrule_weekday

from celery_routines.errors import ScheduleError

__all__ = ["HORIZON_YEARS", "MAX_WALKED", "bounded_walk", "restarted_near"]

HORIZON_YEARS = 30
"""How far after the asked time a rule is searched for its next window.

The rarest calendar patterns a team writes recur within 28 years (the 5th
Friday of February: 2036, 2064, 2092), and croniter refuses a cron with no
match in 50 years the same way; 30 years of a rule that never matches is
about 11,000 steps of dateutil, some 50 ms."""

MAX_WALKED = 50_000
"""The most occurrences listed before the asked time in one question (about
0.2 s): a rule restarted near the asked time lists a period or two; a rule
with ``COUNT`` is walked from ``DTSTART``, and one that lists more than this
is refused (write ``UNTIL`` instead)."""

MAX_YEARS_BEFORE = 100
"""How far before the asked time a rule with ``COUNT`` may start."""

# The periods a restart point moves by; months and years are counted apart.
_UNITS = {
    WEEKLY: timedelta(weeks=1),
    DAILY: timedelta(days=1),
    HOURLY: timedelta(hours=1),
    MINUTELY: timedelta(minutes=1),
    SECONDLY: timedelta(seconds=1),
}
# dateutil lists the first week of a rule from DTSTART's day, not from the
# week's start (WKST): a BYSETPOS can pick another day in that week.
# Restarting a week and a day before the asked time keeps the cut week
# before it. (A day, an hour, a minute are listed whole.)
_CUT_WEEK = timedelta(days=8)


class _BeyondHorizon(Exception):
    """The walk passed the horizon without an occurrence."""


class _CountedRule(rrule):
    """A copy of a rule whose walk counts dateutil's monthly rebuilds."""

    @property
    def _byeaster(self) -> Any:
        state = self.__dict__
        state["_rebuilds_left"] -= 1
        if state["_rebuilds_left"] < 0:
            raise _BeyondHorizon
        return state["_byeaster"]


def _months(start: datetime, end: datetime) -> int:
    return (end.year - start.year) * 12 + end.month - start.month


# ``rule: Any``: dateutil's stubs do not name the private fields read here.
def bounded_walk(rule: Any, wall: datetime, text: str) -> Iterator[datetime]:
    """The occurrences of ``rule`` (naive local times), stepping at most
    :data:`HORIZON_YEARS` past ``wall`` and listing at most
    :data:`MAX_WALKED` up to ``wall``; past either, :class:`ScheduleError`
    naming ``text``."""
    _refuse_empty_positions(rule, text)
    start: datetime = rule._dtstart
    filters = _day_filters(rule) if rule._freq in (MINUTELY, SECONDLY) else None
    walked = 0
    try:
        source = (
            _counted(rule, wall, text) if filters is None else _by_day(rule, filters, wall, text)
        )
        for occurrence in source:
            yield occurrence
            walked += occurrence <= wall
            if walked > MAX_WALKED:
                raise ScheduleError(
                    f"rrule {text!r} lists more than {MAX_WALKED} occurrences from "
                    f"{start.isoformat()} to reach {wall.isoformat()}: end it with UNTIL "
                    "rather than COUNT, or move DTSTART closer"
                )
    except ScheduleError:
        raise
    except _BeyondHorizon:
        raise ScheduleError(
            f"rrule {text!r} has no window in the {HORIZON_YEARS} years after "
            f"{max(wall, start).isoformat()}: it never fires"
        ) from None
    except (ValueError, OverflowError, IndexError) as exc:  # dateutil, only while walking
        raise ScheduleError(f"rrule {text!r} cannot be computed: {exc}") from None


def _counted(rule: Any, wall: datetime, text: str) -> Any:
    """A copy of ``rule`` that stops (:class:`_BeyondHorizon`) at the horizon."""
    counted = _CountedRule.__new__(_CountedRule)
    counted.__dict__.update(rule.__dict__)
    counted.__dict__["_rebuilds_left"] = _rebuilds(rule, wall, text)
    return counted


def _refuse_empty_positions(rule: Any, text: str) -> None:
    """A BYSETPOS of an hourly or finer rule picks among the times of one
    period (the BYMINUTE x BYSECOND of an hour, the BYSECOND of a minute,
    the one second): positions past them all pick nothing, ever, and
    dateutil would step every period of 30 years to find that out."""
    positions = rule._bysetpos
    if not positions or rule._freq not in (HOURLY, MINUTELY, SECONDLY):
        return
    per_period = {
        HOURLY: len(rule._byminute or ()) * len(rule._bysecond or ()),
        MINUTELY: len(rule._bysecond or ()),
        SECONDLY: 1,
    }[rule._freq]
    if all(not -per_period <= position <= per_period for position in positions):
        raise ScheduleError(
            f"rrule {text!r} has no window: each period has {per_period} time(s), so "
            f"BYSETPOS={','.join(map(str, positions))} picks none of them; it never fires"
        )


def _day_filters(rule: Any) -> dict[str, Any] | None:
    """The filters that take or leave a whole day of a minutely or secondly
    rule (None without any): dateutil steps such a rule through every day it
    leaves out (up to 86,400 steps a day when BYHOUR is set too)."""
    monthdays = (*(rule._bymonthday or ()), *(rule._bynmonthday or ()))
    filters = {
        "bymonth": rule._bymonth,
        "bymonthday": monthdays or None,
        "byyearday": rule._byyearday,
        "byweekno": rule._byweekno,
        # Plain weekdays: a rule finer than monthly ignores an ordinal (1MO).
        "byweekday": rule._byweekday,
        "byeaster": rule._byeaster,
    }
    kept = {name: value for name, value in filters.items() if value is not None}
    return kept or None


def _by_day(rule: Any, filters: dict[str, Any], wall: datetime, text: str) -> Iterator[datetime]:
    """The occurrences of a minutely or secondly rule with day filters: the
    days it takes come from a daily rule with those filters (one step a
    day, bounded by the horizon), and each day's times from the rule without
    them, restarted in phase at that day and ended with it."""
    start: datetime = rule._dtstart
    until: datetime | None = rule._until
    left: int | None = rule._count
    days = rrule(
        DAILY,
        dtstart=datetime(start.year, start.month, start.day),
        until=until,
        wkst=rule._wkst,
        **filters,
    )
    unit = _UNITS[rule._freq] * rule._interval
    bare = {name: None for name in filters}
    for day in _counted(days, wall, text):
        # A counted rule lists every time (its COUNT runs from DTSTART);
        # any other starts at the asked time on its first day.
        lower = day if left is not None else max(day, wall)
        point = start + max((lower - start) // unit, 0) * unit
        end = day + timedelta(days=1) - timedelta(microseconds=1)
        if until is not None:
            end = min(end, until)
        if point > end:
            continue
        one_day = rule.replace(
            dtstart=point,
            until=end,
            count=None,
            byhour=rule._byhour,
            byminute=rule._byminute,
            bysecond=rule._bysecond,
            **bare,
        )
        for occurrence in one_day:
            if occurrence < day:
                continue
            yield occurrence
            if left is not None:
                left -= 1
                if left <= 0:
                    return


def _rebuilds(rule: Any, wall: datetime, text: str) -> int:
    """How many rebuilds take dateutil from ``DTSTART`` to the horizon:
    one per month a daily or finer rule enters, one per period of a monthly
    or yearly rule, two at the start; twice as many reads with BYEASTER."""
    start: datetime = rule._dtstart
    before = max(_months(start, wall), 0)
    if before > 12 * MAX_YEARS_BEFORE:
        # Only a rule with COUNT gets here: any other is restarted near wall.
        raise ScheduleError(
            f"rrule {text!r} starts {before // 12} years before {wall.isoformat()}; a rule "
            f"with COUNT is counted from DTSTART, at most {MAX_YEARS_BEFORE} years back: "
            "end it with UNTIL rather than COUNT, or move DTSTART closer"
        )
    months_per_period = {YEARLY: 12, MONTHLY: 1}.get(rule._freq)
    months = before + 12 * HORIZON_YEARS
    periods = (
        months if months_per_period is None else months // (months_per_period * rule._interval)
    )
    return (periods + 3) * (2 if rule._byeaster else 1)


def restarted_near(rule: Any, wall: datetime) -> Any:
    """``rule`` restarted at a point of its phase a period or so before
    ``wall``; ``rule`` itself when ``DTSTART`` is that close already. Not for
    a rule with ``COUNT`` (its count runs from ``DTSTART``)."""
    start: datetime = rule._dtstart
    freq, interval = rule._freq, rule._interval
    if freq == YEARLY:
        # A restart on the first day of a period of the rule keeps every
        # occurrence of that period: the whole period is listed again.
        steps = (wall.year - start.year) // interval * interval
        if steps <= 0:
            return rule
        point = datetime(start.year + steps, 1, 1)
    elif freq == MONTHLY:
        steps = _months(start, wall) // interval * interval
        if steps <= 0:
            return rule
        index = start.month - 1 + steps
        point = datetime(start.year + index // 12, index % 12 + 1, 1)
    else:
        unit = _UNITS[freq] * interval
        cut = _CUT_WEEK if freq == WEEKLY else timedelta(0)
        steps = (wall - start - cut - unit) // unit
        if steps <= 0:
            return rule
        point = start + steps * unit
    return rule.replace(dtstart=point, **_resolved(rule))


def _resolved(rule: Any) -> dict[str, Any]:
    """The fields dateutil derives from ``DTSTART`` when the rule leaves them
    out (the month and day of a yearly rule, the weekday of a weekly one,
    the time of a daily one), as ``DTSTART`` made them: a restart keeps them."""
    monthdays = (*(rule._bymonthday or ()), *(rule._bynmonthday or ()))
    weekdays = [
        *(rrule_weekday(day) for day in rule._byweekday or ()),
        *(rrule_weekday(day, n) for day, n in rule._bynweekday or ()),
    ]
    return {
        "bymonth": rule._bymonth,
        "bymonthday": monthdays or None,
        "byweekday": weekdays or None,
        "byhour": rule._byhour,
        "byminute": rule._byminute,
        "bysecond": rule._bysecond,
    }
