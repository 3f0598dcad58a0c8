"""parse_schedule and schedule_from_columns: every accepted form, every refusal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from functools import cached_property
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, schedule

from celery_routines.errors import ScheduleError
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.parse import (
    crontab_to_cron,
    parse_schedule,
    schedule_from_columns,
)


def test_cron_string_uses_the_given_zone() -> None:
    assert parse_schedule("30 2 * * *", "Europe/Rome") == CronSchedule("30 2 * * *", "Europe/Rome")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (timedelta(minutes=5), 300.0),
        (timedelta(milliseconds=1500), 1.5),
        (300, 300.0),
        (2.5, 2.5),
        (schedule(run_every=timedelta(seconds=90)), 90.0),
        (schedule(run_every=30), 30.0),
    ],
)
def test_intervals(value: object, seconds: float) -> None:
    assert parse_schedule(value, "Europe/Rome") == IntervalSchedule(seconds)


def test_schedules_pass_through() -> None:
    cron = CronSchedule("0 9 * * 1-5", "America/New_York")
    interval = IntervalSchedule(60)
    assert parse_schedule(cron, "UTC") is cron
    assert parse_schedule(interval, "UTC") is interval


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "cannot use bool True as a schedule"),
        (None, "cannot use NoneType None as a schedule"),
        ([1, 2], "cannot use list [1, 2] as a schedule"),
        (datetime(2026, 1, 1, tzinfo=UTC), "cannot use datetime datetime.datetime(2026, 1, 1"),
    ],
)
def test_unsupported_values_are_named(value: object, message: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        parse_schedule(value, "UTC")
    assert str(raised.value).startswith(message)
    assert "expected a 5-field cron string, a timedelta, a number of seconds" in str(raised.value)


def test_numeric_string_gets_a_hint() -> None:
    with pytest.raises(ScheduleError, match="schedule '300' is a string: pass a number"):
        parse_schedule("300", "UTC")


def test_bad_values_surface_the_schedule_errors() -> None:
    with pytest.raises(ScheduleError, match="interval must be positive, got -5 seconds"):
        parse_schedule(-5, "UTC")
    with pytest.raises(ScheduleError, match="cron expression '61 \\* \\* \\* \\*' is invalid"):
        parse_schedule("61 * * * *", "UTC")
    with pytest.raises(ScheduleError, match="unknown timezone 'Mars/Base'"):
        parse_schedule("* * * * *", "Mars/Base")


# -- Celery crontab ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expression"),
    [
        (crontab(minute=30, hour=2), "30 2 * * *"),
        (crontab(minute="*/15"), "*/15 * * * *"),
        (crontab(minute=[0, 30], hour="9-17", day_of_week="mon-fri"), "0,30 9-17 * * mon-fri"),
        (crontab(minute={0, 15, 30, 45}), "0,15,30,45 * * * *"),
        (crontab(minute=range(0, 60, 20)), "0,20,40 * * * *"),
        (crontab(minute=0, hour="*/3", month_of_year="jan,jul"), "0 */3 * jan,jul *"),
        (crontab.from_string("0 9 1-7 * *"), "0 9 1-7 * *"),
        # Celery ANDs the day fields; a full day-of-week is no restriction, so it
        # must become '*' (cron would OR '1' with '0-6' and fire every day).
        (crontab(minute=0, hour=0, day_of_month="1", day_of_week="0-6"), "0 0 1 * *"),
        (crontab(minute=0, hour=0, day_of_week="sat,sun"), "0 0 * * sat,sun"),
    ],
)
def test_crontab_conversion(value: crontab, expression: str) -> None:
    assert crontab_to_cron(value) == expression
    assert parse_schedule(value, "Europe/Rome") == CronSchedule(expression, "Europe/Rome")


def test_crontab_spelling_croniter_reads_differently_falls_back_to_celerys_set() -> None:
    value = crontab(minute="0,30")
    value._orig_minute = "7"  # an original spelling that no longer matches the set
    assert crontab_to_cron(value) == "0,30 * * * *"


def test_crontab_restricting_both_day_fields_is_refused() -> None:
    with pytest.raises(ScheduleError) as raised:
        parse_schedule(crontab(minute=0, hour=9, day_of_month="1-7", day_of_week="mon"), "UTC")
    message = str(raised.value)
    assert "day_of_month='1-7'" in message and "day_of_week='mon'" in message
    assert "restrict only one of them" in message


def test_crontab_converted_windows_match_celery_semantics() -> None:
    # 09:00 on weekdays, read in the routine's zone.
    parsed = parse_schedule(crontab(minute=0, hour=9, day_of_week="mon-fri"), "America/New_York")
    friday = datetime(2026, 3, 6, 15, 0, tzinfo=UTC)  # Friday 10:00 EST
    assert parsed.next_after(friday) == datetime(2026, 3, 9, 13, 0, tzinfo=UTC)  # Monday EDT


def test_crontab_keeps_a_zone_assigned_to_it() -> None:
    value = crontab(minute=30, hour=2)
    value.tz = ZoneInfo("America/New_York")
    assert parse_schedule(value, "Europe/Rome") == CronSchedule("30 2 * * *", "America/New_York")


def test_crontab_subclass_with_its_own_zone() -> None:
    class RomeCrontab(crontab):
        @cached_property
        def tz(self) -> ZoneInfo:
            return ZoneInfo("Europe/Rome")

    assert parse_schedule(RomeCrontab(minute=0, hour=9), "UTC") == CronSchedule(
        "0 9 * * *", "Europe/Rome"
    )


def test_crontab_without_a_zone_uses_the_given_one_and_never_asks_the_app() -> None:
    value = crontab(minute=0, hour=9)
    assert parse_schedule(value, "Asia/Tokyo") == CronSchedule("0 9 * * *", "Asia/Tokyo")
    assert "tz" not in vars(value)  # the cached property was not evaluated


def test_crontab_with_a_fixed_offset_zone_is_refused() -> None:
    value = crontab(minute=0, hour=9)
    value.tz = timezone(timedelta(hours=2))
    with pytest.raises(ScheduleError, match="pass timezone='Europe/Rome'"):
        parse_schedule(value, "UTC")


def test_crontab_with_utc_zone() -> None:
    value = crontab(minute=0, hour=9)
    value.tz = UTC
    assert parse_schedule(value, "Europe/Rome") == CronSchedule("0 9 * * *", "UTC")


# -- database rows ------------------------------------------------------------------


def test_schedule_from_columns() -> None:
    assert schedule_from_columns("30 2 * * *", None, "Europe/Rome") == CronSchedule(
        "30 2 * * *", "Europe/Rome"
    )
    assert schedule_from_columns(None, 60.0, "Europe/Rome") == IntervalSchedule(60)


@pytest.mark.parametrize(("cron", "interval"), [(None, None), ("* * * * *", 60.0)])
def test_schedule_from_columns_needs_exactly_one(cron: str | None, interval: float | None) -> None:
    with pytest.raises(ScheduleError, match=r"^set exactly one of cron, interval_seconds, at"):
        schedule_from_columns(cron, interval, "UTC")


def test_schedule_from_columns_validates_its_values() -> None:
    with pytest.raises(ScheduleError, match="interval must be positive"):
        schedule_from_columns(None, 0.0, "UTC")
    with pytest.raises(ScheduleError, match="unknown timezone"):
        schedule_from_columns("* * * * *", None, "Nowhere/City")
