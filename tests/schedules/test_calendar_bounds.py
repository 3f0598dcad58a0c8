"""Exclusions that remove every window are found out in bounded time, with
and without a shift; calendars with many exclusions keep firing."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from celery_routines.errors import ScheduleError
from celery_routines.schedules.calendar import CalendarSchedule, Shift
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.exclusions import Exclusions
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.parse import schedule_from_columns

ZONE = "Europe/Rome"
NOW = datetime(2026, 12, 7, 12, tzinfo=UTC)  # a Monday
# Without the bounds these took 13 s (no shift) and over a minute (shift).
BOUND_SECONDS = 2.0


def test_an_exclusion_of_every_minute_is_refused_when_built() -> None:
    with pytest.raises(ScheduleError, match=r"exclude cron '\* \* \* \* \*' matches every minute"):
        schedule_from_columns("0 9 * * *", None, ZONE, exclude='["* * * * *"]')


@pytest.mark.parametrize(
    ("inner", "shift"),
    [
        ("* * * * *", None),
        ("* * * * *", "next_business_day"),
        ("* * * * *", "previous_business_day"),
        (1.0, None),  # an interval (never shifted)
    ],
)
def test_exclusions_that_remove_every_window_are_an_error_in_bounded_time(
    inner: str | float, shift: str | None
) -> None:
    cron, interval = (inner, None) if isinstance(inner, str) else (None, inner)
    schedule = schedule_from_columns(
        cron, interval, ZONE, exclude='["* * * * 1-5", "* * * * 0,6"]', shift=shift
    )
    started = time.perf_counter()
    with pytest.raises(ScheduleError, match="10000"):
        schedule.next_after(NOW)
    assert time.perf_counter() - started < BOUND_SECONDS


def test_a_calendar_with_many_exclusions_fires_after_a_long_weekend() -> None:
    # Office hours, every 5 minutes, weekends off, 350 single days off
    # (every Tuesday for seven years), and Christmas week.
    tuesdays = [date(2026, 12, 8) + timedelta(weeks=k) for k in range(350)]
    entries = [
        "* 0-8,18-23 * * *",
        "* * * * 6,0",
        "2026-12-24..2026-12-28",
        *(day.isoformat() for day in tuesdays),
    ]
    schedule = CalendarSchedule(
        CronSchedule("*/5 * * * *", ZONE), Exclusions(tuple(entries)), None, ZONE
    )
    tz = ZoneInfo(ZONE)
    friday_evening = datetime(2026, 12, 18, 17, 56, tzinfo=tz)
    started = time.perf_counter()
    assert schedule.next_after(friday_evening) == datetime(2026, 12, 21, 9, 0, tzinfo=tz)
    # Thursday after 17:55: Christmas Eve to the 28th, then a Tuesday off.
    assert schedule.next_after(datetime(2026, 12, 23, 17, 56, tzinfo=tz)) == datetime(
        2026, 12, 30, 9, 0, tzinfo=tz
    )
    assert time.perf_counter() - started < BOUND_SECONDS


def test_a_shifted_calendar_with_a_cron_exclusion_still_moves_its_windows() -> None:
    schedule = CalendarSchedule(
        CronSchedule("0 9 1 * *", ZONE),
        Exclusions(("2027-02-01", "0 9 1 1 *")),
        Shift.NEXT_BUSINESS_DAY,
        ZONE,
    )
    tz = ZoneInfo(ZONE)
    # 1 January is removed by the cron; 1 February is off, moved to the 2nd.
    assert schedule.next_after(NOW + timedelta(days=30)) == datetime(2027, 2, 2, 9, tzinfo=tz)


def test_looking_for_the_next_excluded_window_lists_windows_cheaply() -> None:
    schedule = CalendarSchedule(
        IntervalSchedule(60), Exclusions(("2030-01-01",)), None, ZONE
    )  # nothing excluded within the 5,000 windows looked at
    minute_cron = CalendarSchedule(
        CronSchedule("* * * * *", ZONE), Exclusions(("2030-01-01",)), None, ZONE
    )
    started = time.perf_counter()
    assert schedule.next_excluded(NOW) is None
    assert minute_cron.next_excluded(NOW) is None  # was 5,000 cron questions: ~15 s
    assert time.perf_counter() - started < BOUND_SECONDS
