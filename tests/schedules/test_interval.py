"""IntervalSchedule: validation, anchoring, O(1) counting."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from celery_routines.errors import ScheduleError
from celery_routines.schedules.interval import (
    MAX_INTERVAL_SECONDS,
    IntervalSchedule,
    whole_second_after,
    whole_seconds,
)

START = datetime(2026, 3, 29, 0, 59, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "message"),
    [
        (-5, "interval must be positive, got -5 seconds"),
        (0, "interval must be positive, got 0 seconds"),
        (-0.5, "interval must be positive, got -0.5 seconds"),
        (math.inf, "interval must be a finite number of seconds, got inf"),
        (math.nan, "interval must be a finite number of seconds, got nan"),
        (MAX_INTERVAL_SECONDS + 1, "interval must be at most"),
        (1e-9, "interval must be at least 1 microsecond"),
        (True, "interval must be a number of seconds, got bool True"),
        ("300", "interval must be a number of seconds, got str '300'"),
    ],
)
def test_invalid_intervals(seconds: object, message: str) -> None:
    with pytest.raises(ScheduleError, match="^" + re.escape(message)):
        IntervalSchedule(seconds)  # type: ignore[arg-type]


def test_valid_interval_is_normalised_to_float() -> None:
    schedule = IntervalSchedule(300)
    assert schedule.seconds == 300.0 and isinstance(schedule.seconds, float)
    assert schedule == IntervalSchedule(300.0)
    assert schedule.step == timedelta(minutes=5)
    assert IntervalSchedule(MAX_INTERVAL_SECONDS).seconds == MAX_INTERVAL_SECONDS


def test_describe() -> None:
    assert IntervalSchedule(300).describe() == "every 300 seconds"
    assert IntervalSchedule(0.5).describe() == "every 0.5 seconds"


def test_next_after_is_anchored_on_the_previous_window_and_ignores_dst() -> None:
    schedule = IntervalSchedule(60)
    # 00:59:30Z is just before Rome's spring gap: real time, no local time.
    assert schedule.next_after(START) == datetime(2026, 3, 29, 1, 0, 30, tzinfo=UTC)


def test_windows_are_after_plus_k_steps() -> None:
    schedule = IntervalSchedule(300)
    until = START + timedelta(minutes=15)
    assert list(schedule.windows(START, until)) == [
        START + timedelta(minutes=5),
        START + timedelta(minutes=10),
        START + timedelta(minutes=15),
    ]
    assert schedule.count_windows(START, until) == 3
    assert schedule.count_windows(START, until - timedelta(microseconds=1)) == 2
    assert schedule.last_windows(START, until, 2) == [
        START + timedelta(minutes=10),
        START + timedelta(minutes=15),
    ]
    assert schedule.last_windows(START, until, 10) == list(schedule.windows(START, until))


def test_empty_ranges() -> None:
    schedule = IntervalSchedule(60)
    assert list(schedule.windows(START, START)) == []
    assert schedule.count_windows(START, START - timedelta(days=1)) == 0
    assert schedule.last_windows(START, START + timedelta(minutes=5), 0) == []


def test_output_is_utc_for_non_utc_input() -> None:
    rome = START.astimezone(ZoneInfo("Europe/Rome"))
    window = IntervalSchedule(60).next_after(rome)
    assert window.tzinfo is UTC and window == START + timedelta(minutes=1)


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        IntervalSchedule(60).next_after(datetime(2026, 1, 1))


def test_a_year_of_one_minute_windows_is_counted_without_iterating() -> None:
    schedule = IntervalSchedule(60)
    until = START + timedelta(days=365)
    assert schedule.count_windows(START, until) == 365 * 24 * 60
    assert schedule.last_windows(START, until, 3) == [
        until - timedelta(minutes=2),
        until - timedelta(minutes=1),
        until,
    ]


@settings(max_examples=100, deadline=None)
@given(
    seconds=st.floats(min_value=0.001, max_value=100_000, allow_nan=False),
    span=st.floats(min_value=0, max_value=2_000_000),
    n=st.integers(1, 30),
)
def test_count_last_and_next_after_agree_with_windows(seconds: float, span: float, n: int) -> None:
    schedule = IntervalSchedule(seconds)
    until = START + timedelta(seconds=span)
    assume(schedule.count_windows(START, until) <= 5000)  # keep the listing small
    listed = list(schedule.windows(START, until))
    assert schedule.count_windows(START, until) == len(listed)
    assert schedule.last_windows(START, until, n) == listed[-n:]
    chained, cursor = [], START
    while (cursor := schedule.next_after(cursor)) <= until and len(chained) < 50:
        chained.append(cursor)
    assert chained == listed[: len(chained)]


def test_an_imported_interval_is_whole_seconds_and_never_0() -> None:
    assert [whole_seconds(s) for s in (1.5, 2.5, 2.4, 0.3, 1e-6, 90.0)] == [
        2.0, 3.0, 2.0, 1.0, 1.0, 90.0,
    ]  # fmt: skip
    # Not a positive number: left as it is, for the schedule's own refusal.
    assert whole_seconds(0) == 0 and whole_seconds(-1.5) == -1.5
    at = datetime(2026, 10, 24, 12, 0, 0, 1, tzinfo=UTC)
    assert whole_second_after(at) == datetime(2026, 10, 24, 12, 0, 1, tzinfo=UTC)
    assert whole_second_after(at.replace(microsecond=0)) == at.replace(microsecond=0)
