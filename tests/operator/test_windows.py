"""The operator's time parsing and window helpers (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from celery_routines.operator.windows import check_count, parse_instant, range_windows
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.store import RoutineRecord

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30", datetime(2026, 11, 29, 23, 0, tzinfo=UTC)),  # midnight in Rome
        ("2026-11-30T08:00", datetime(2026, 11, 30, 7, 0, tzinfo=UTC)),
        ("2026-11-30T08:00+00:00", datetime(2026, 11, 30, 8, 0, tzinfo=UTC)),
        ("2h", datetime(2026, 11, 30, 10, 0, tzinfo=UTC)),
        ("7d", datetime(2026, 11, 23, 12, 0, tzinfo=UTC)),
    ],
)
def test_instants_are_read_in_the_routines_zone_or_as_ages(text: str, expected: datetime) -> None:
    assert parse_instant(text, "Europe/Rome", NOW) == expected


def test_a_bad_instant_names_itself() -> None:
    with pytest.raises(ValueError, match="yesterday"):
        parse_instant("yesterday", "UTC", NOW)


def test_counts_are_bounded() -> None:
    check_count("n", 5, 10)
    with pytest.raises(ValueError, match="n"):
        check_count("n", 11, 10)


def record(next_run_at: datetime | None) -> RoutineRecord:
    return RoutineRecord(
        id=1, name="poll", task="t", cron=None, interval_seconds=600.0, timezone=None,
        enabled=True, args="[]", kwargs="{}", options="{}", catch_up="catch_up",
        catch_up_cap=25, max_lateness=None, overlap="skip", max_retries=4,
        retry_base_seconds=60.0, ceiling=None, next_run_at=next_run_at, paused=False,
        suspended_until=None, suspended_reason=None, last_error=None, locked_by=None,
        locked_until=None,
    )  # fmt: skip


def test_interval_windows_stay_on_the_routines_own_grid() -> None:
    anchor = datetime(2026, 11, 30, 12, 5, tzinfo=UTC)
    windows = range_windows(
        IntervalSchedule(600), record(anchor), datetime(2026, 11, 30, 11, 0, tzinfo=UTC), NOW, 10
    )
    assert [w.strftime("%H:%M") for w in windows] == [
        "11:05",
        "11:15",
        "11:25",
        "11:35",
        "11:45",
        "11:55",
    ]


def test_cron_windows_in_a_range_and_the_cap() -> None:
    every_quarter = CronSchedule("*/15 * * * *", "UTC")
    start = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)
    assert len(range_windows(every_quarter, record(None), start, NOW, 10)) == 5
    with pytest.raises(ValueError, match="covers 5 windows; at most 4"):
        range_windows(every_quarter, record(None), start, NOW, 4)
