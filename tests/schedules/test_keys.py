"""window_key: the deterministic idempotency key of a window (guarantee 2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from celery_routines.errors import ScheduleError
from celery_routines.schedules.keys import skip_key, window_in_key, window_key


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


@pytest.mark.parametrize(
    ("window", "zone", "key"),
    [
        # The contract's example: 02:30 did not exist, the window is 03:30 CEST.
        (utc(2026, 3, 29, 1, 30), "Europe/Rome", "nightly@2026-03-29T03:30:00+02:00"),
        # The two passes of the repeated hour get different keys.
        (utc(2026, 10, 25, 0, 30), "Europe/Rome", "nightly@2026-10-25T02:30:00+02:00"),
        (utc(2026, 10, 25, 1, 30), "Europe/Rome", "nightly@2026-10-25T02:30:00+01:00"),
        (utc(2026, 10, 3, 15, 45), "Australia/Lord_Howe", "nightly@2026-10-04T02:45:00+11:00"),
        (utc(2026, 1, 1), "UTC", "nightly@2026-01-01T00:00:00+00:00"),
    ],
)
def test_window_key(window: datetime, zone: str, key: str) -> None:
    assert window_key("nightly", window, zone) == key
    # And back: the two passes of the repeated hour stay apart through UTC.
    assert window_in_key("nightly", key) == window


@pytest.mark.parametrize(
    "key",
    [
        "other@2026-01-01T00:00:00+00:00",  # another routine's
        "nightly@2026-01-01T00:00:00",  # no offset: not a key we write
        "nightly@soon",
        skip_key("nightly", utc(2026, 1, 1), utc(2026, 1, 2), 2, "UTC"),  # a summary's
    ],
)
def test_what_is_not_a_window_key_of_the_routine_names_no_window(key: str) -> None:
    assert window_in_key("nightly", key) is None


def test_a_routine_name_with_an_at_sign_reads_back() -> None:
    key = window_key("team@poll", utc(2026, 1, 1), "Europe/Rome")
    assert window_in_key("team@poll", key) == utc(2026, 1, 1)


def test_key_depends_on_the_instant_not_on_how_it_was_written() -> None:
    same = utc(2026, 3, 29, 1, 30).astimezone(timezone(timedelta(hours=-7)))
    assert window_key("nightly", same, "Europe/Rome") == "nightly@2026-03-29T03:30:00+02:00"


def test_sub_second_interval_windows_keep_their_microseconds() -> None:
    key = window_key("poll", utc(2026, 1, 1, 0, 0, 0) + timedelta(microseconds=500_000), "UTC")
    assert key == "poll@2026-01-01T00:00:00.500000+00:00"


def test_naive_window_and_unknown_zone_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        window_key("nightly", datetime(2026, 1, 1), "UTC")
    with pytest.raises(ScheduleError, match="unknown timezone 'Mars/Base'"):
        window_key("nightly", utc(2026, 1, 1), "Mars/Base")
