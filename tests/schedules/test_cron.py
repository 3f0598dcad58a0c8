"""CronSchedule: validation, description, counting fast paths and their cost."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from celery_routines.errors import ScheduleError
from celery_routines.schedules.cron import MAX_SPAN_DAYS, CronSchedule
from tests.work import ScheduleWork

EXPECTED_FIELDS = "expected 5 fields: minute hour day-of-month month day-of-week"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


# -- validation ----------------------------------------------------------------


def test_out_of_range_field_names_value_and_fix() -> None:
    with pytest.raises(ScheduleError) as raised:
        CronSchedule("61 * * * *", "UTC")
    assert str(raised.value) == (
        "cron expression '61 * * * *' is invalid: minute field '61' is out of range 0-59"
    )


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("* 24 * * *", "hour field '24' is out of range 0-23"),
        ("* * 0 * *", "day-of-month field '0' is out of range 1-31"),
        ("* * 32 * *", "day-of-month field '32' is out of range 1-31"),
        ("* * * 13 *", "month field '13' is out of range 1-12"),
        ("* * * * 8", "day-of-week field '8' is out of range 0-7"),
        ("1,61 * * * *", "minute field '1,61': 61 is out of range 0-59"),
        ("0 1-25 * * *", "hour field '1-25': 25 is out of range 0-23"),
        ("*/0 * * * *", "minute field '*/0' has a step of 0, which never advances"),
        ("x * * * *", "minute field 'x' is not valid: write numbers 0-59"),
        ("0 0 * foo *", "month field 'foo' is not valid: write numbers 1-12 or jan-dec"),
        ("0 0 * * 8L", "day-of-week field '8L' is not valid: write numbers 0-7 or sun-sat"),
        ("0 0 LW * *", "day-of-month field 'LW' is not valid: write numbers 1-31, L, nW"),
        ("0 0 * * 1#6", "day-of-week field '1#6' is not valid"),
        ("0 0 * * 1-5L", "day-of-week field '1-5L' is not valid"),
    ],
)
def test_each_field_is_named_with_its_value_and_range(expression: str, problem: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        CronSchedule(expression, "UTC")
    assert str(raised.value).startswith(f"cron expression {expression!r} is invalid: {problem}")


@pytest.mark.parametrize(
    ("expression", "count"),
    [("* * * *", 4), ("0 0 * * * *", 6), ("", 0), ("0 9 *", 3)],
)
def test_the_wrong_number_of_fields_says_which_five(expression: str, count: int) -> None:
    with pytest.raises(ScheduleError) as raised:
        CronSchedule(expression, "UTC")
    message = str(raised.value)
    assert message.startswith(
        f"cron expression {expression!r} is invalid: it has {count} fields, {EXPECTED_FIELDS}"
    )
    assert ("seconds field is not supported" in message) == (count == 6)


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("@dayly", "unknown alias '@dayly'; known: @yearly, @annually, @monthly"),
        ("R 0 * * *", "random (R) and hashed (H) fields are not supported"),
        ("H 0 * * *", "random (R) and hashed (H) fields are not supported"),
        ("0 0 30 2 *", "it never fires"),
        ("0 0 31 2,4 *", "it never fires"),
        ("0 25 * * *", "out of range"),
        ("a b c d e", "is invalid"),
    ],
)
def test_invalid_expressions(expression: str, problem: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        CronSchedule(expression, "UTC")
    message = str(raised.value)
    assert f"cron expression {expression!r} is invalid" in message
    assert problem in message


def test_non_string_expression() -> None:
    with pytest.raises(ScheduleError, match="expected a string, got int"):
        CronSchedule(5, "UTC")  # type: ignore[arg-type]


def test_unknown_zone() -> None:
    with pytest.raises(ScheduleError, match="unknown timezone 'Mars/Base'"):
        CronSchedule("* * * * *", "Mars/Base")


@pytest.mark.parametrize(
    "expression",
    ["0 0 L * *", "0 0 * * 5#2", "0 0 15W * *", "0 9 * JAN-MAR MON-FRI", "0 0 ? * 1", "0 0 * * 7"],
)
def test_croniter_extensions_are_accepted(expression: str) -> None:
    CronSchedule(expression, "UTC").next_after(utc(2026, 1, 1))


@pytest.mark.parametrize(
    ("alias", "fields"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        (" @Daily ", "0 0 * * *"),
    ],
)
def test_aliases_fire_as_their_fields_and_keep_their_spelling(alias: str, fields: str) -> None:
    schedule = CronSchedule(alias, "Europe/Rome")
    assert schedule.expression == alias.strip().lower()
    after, until = utc(2026, 1, 1), utc(2028, 1, 1, 0, 0)
    if alias.strip() == "@hourly":
        until = utc(2026, 4, 1)  # through Rome's spring gap
    assert list(schedule.windows(after, until)) == list(
        CronSchedule(fields, "Europe/Rome").windows(after, until)
    )


@pytest.mark.parametrize(
    ("expression", "first_dates"),
    [
        # The last Friday of each month (Quartz's 5L, croniter's L5), by name too.
        ("0 9 * * 5L", ["2026-01-30", "2026-02-27", "2026-03-27"]),
        ("0 9 * * friL", ["2026-01-30", "2026-02-27", "2026-03-27"]),
        ("0 9 * * 0L", ["2026-01-25", "2026-02-22", "2026-03-29"]),
        ("0 9 * * 7L", ["2026-01-25", "2026-02-22", "2026-03-29"]),
        # A list mixing the forms: the first Monday or the last Friday.
        ("0 9 * * 1#1,5L", ["2026-01-05", "2026-01-30", "2026-02-02"]),
    ],
)
def test_last_weekday_of_the_month(expression: str, first_dates: list[str]) -> None:
    windows = CronSchedule(expression, "UTC").windows(utc(2026, 1, 1), utc(2026, 4, 1))
    assert [w.date().isoformat() for w in windows][:3] == first_dates


def test_whitespace_is_normalised_and_equality_uses_the_text() -> None:
    schedule = CronSchedule("  30   2 * * * ", "Europe/Rome")
    assert schedule.expression == "30 2 * * *"
    assert schedule == CronSchedule("30 2 * * *", "Europe/Rome")
    assert schedule != CronSchedule("30 2 * * *", "UTC")
    assert hash(schedule) == hash(CronSchedule("30 2 * * *", "Europe/Rome"))


def test_describe() -> None:
    assert CronSchedule("30 2 * * *", "Europe/Rome").describe() == "cron '30 2 * * *' (Europe/Rome)"


@pytest.mark.parametrize(
    ("expression", "real_time"),
    [
        ("*/15 * * * *", True),
        ("0 */2 * * *", True),
        ("0 1-23/3 * * *", True),
        ("0 0-23 * * *", True),  # all 24 hours: a wildcard in all but spelling
        ("30 2 * * *", False),
        ("0 9,17 * * 1-5", False),
        ("* 2 * * *", False),
        ("0 0-22 * * *", False),
    ],
)
def test_real_time_is_decided_by_the_hour_field(expression: str, real_time: bool) -> None:
    assert CronSchedule(expression, "UTC").real_time is real_time


def test_naive_datetimes_are_refused() -> None:
    schedule = CronSchedule("* * * * *", "UTC")
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.next_after(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        list(schedule.windows(datetime(2026, 1, 1), utc(2026, 1, 2)))


def test_empty_and_reversed_ranges() -> None:
    schedule = CronSchedule("* * * * *", "UTC")
    start = utc(2026, 1, 1)
    assert list(schedule.windows(start, start)) == []
    assert schedule.count_windows(start, start - timedelta(hours=1)) == 0
    assert schedule.last_windows(start, start - timedelta(hours=1), 5) == []
    assert schedule.last_windows(start, start + timedelta(hours=1), 0) == []


def test_windows_is_lazy() -> None:
    schedule = CronSchedule("* * * * *", "UTC")
    windows = schedule.windows(utc(2000, 1, 1), utc(2037, 1, 1))  # ~19 million minutes
    assert next(windows) == utc(2000, 1, 1, 0, 1)


def test_rare_cron_next_after() -> None:
    leap = CronSchedule("0 12 29 2 *", "Europe/Rome")
    assert leap.next_after(utc(2026, 1, 1)) == utc(2028, 2, 29, 11, 0)
    # 2100 is not a leap year: eight years between windows.
    assert leap.next_after(utc(2096, 3, 1)) == utc(2104, 2, 29, 11, 0)


def test_span_cap_is_enforced() -> None:
    schedule = CronSchedule("0 0 * * *", "UTC")
    start = utc(1900, 1, 1)
    with pytest.raises(ScheduleError, match=f"the limit is {MAX_SPAN_DAYS} days"):
        schedule.count_windows(start, start + timedelta(days=MAX_SPAN_DAYS + 10))
    with pytest.raises(ScheduleError, match="move next_run_at closer to now"):
        schedule.last_windows(start, start + timedelta(days=MAX_SPAN_DAYS + 10), 3)


# -- fast paths equal plain iteration ---------------------------------------------

FAST_PATH_CASES = [
    ("*/7 * * * *", "Europe/Rome"),
    ("30 2 * * *", "Europe/Rome"),
    ("0,30 2,3 * * *", "America/New_York"),
    ("15 2 * * *", "Australia/Lord_Howe"),
    ("*/10 */3 * * 1-5", "Australia/Sydney"),
    ("0 0 L * *", "America/Santiago"),
    ("45 23 * * 6,0", "America/Goose_Bay"),
]


@pytest.mark.parametrize(("expression", "zone"), FAST_PATH_CASES)
def test_count_and_last_equal_iteration_over_a_year(expression: str, zone: str) -> None:
    schedule = CronSchedule(expression, zone)
    after, until = utc(2026, 1, 3, 7, 11), utc(2027, 1, 2, 19, 3)
    listed = list(schedule.windows(after, until))
    assert schedule.count_windows(after, until) == len(listed)
    for n in (1, 25, 400):
        assert schedule.last_windows(after, until, n) == listed[-n:]


def test_goose_bay_2009_count_matches_iteration() -> None:
    # The repeated hour straddles midnight: day lists overlap in time.
    schedule = CronSchedule("*/5 * * * *", "America/Goose_Bay")
    after, until = utc(2009, 10, 30, 1, 2), utc(2009, 11, 3, 5, 7)
    listed = list(schedule.windows(after, until))
    assert schedule.count_windows(after, until) == len(listed)
    assert schedule.last_windows(after, until, 30) == listed[-30:]


# -- cost ------------------------------------------------------------------------


def test_every_minute_for_a_year_counts_and_lists_the_tail_without_listing_the_year(
    schedule_work: ScheduleWork,
) -> None:
    schedule = CronSchedule("* * * * *", "Europe/Rome")
    after, until = utc(2025, 6, 1), utc(2026, 6, 1)

    count = schedule.count_windows(after, until)
    tail = schedule.last_windows(after, until, 25)

    assert count == 365 * 24 * 60
    assert tail == [until - timedelta(minutes=24 - k) for k in range(25)]
    # Steady days are counted, not listed: only the ends and the two DST
    # days are (18 today); listing the year would be 367.
    assert schedule_work.days_listed <= 30
    assert schedule_work.croniter_steps <= 2 * 367  # one step per matching day


def test_next_after_lists_a_day_or_two_per_call_for_every_minute(
    schedule_work: ScheduleWork,
) -> None:
    schedule = CronSchedule("* * * * *", "Europe/Rome")
    # Through the repeated hour of a transition day and an ordinary day.
    for minute in range(0, 200, 2):
        schedule.next_after(utc(2026, 10, 24, 23) + timedelta(minutes=minute))
        schedule.next_after(utc(2026, 7, 1, 12) + timedelta(minutes=minute))
    assert schedule_work.days_listed <= 4 * 200  # 3 per call today
    assert schedule_work.croniter_steps <= 5 * 200  # 4 per call today
