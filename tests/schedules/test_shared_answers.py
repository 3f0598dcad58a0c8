"""Routines that share a cron expression and zone share its answers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from celery_routines.errors import ScheduleError
from celery_routines.schedules import cron
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.cronspec import parse_cron

NOW = datetime(2026, 3, 29, 0, 59, 30, tzinfo=UTC)  # a minute before Paris springs forward


def test_a_thousand_routines_of_one_cron_step_croniter_once_per_question() -> None:
    cron._next_after.cache_clear()
    cron._count_windows.cache_clear()
    schedules = [CronSchedule("*/1 * * * *", "Europe/Paris") for _ in range(1000)]
    answers = {s.next_after(NOW) for s in schedules}
    counts = {s.count_windows(datetime(2026, 3, 29, 0, 0, tzinfo=UTC), NOW) for s in schedules}
    assert answers == {datetime(2026, 3, 29, 1, 0, tzinfo=UTC)}
    assert counts == {59}
    assert cron._next_after.cache_info().misses == 1
    assert cron._count_windows.cache_info().misses == 1


def test_another_zone_gets_its_own_answer() -> None:
    paris = CronSchedule("30 2 * * *", "Europe/Paris")
    utc = CronSchedule("30 2 * * *", "UTC")
    # 02:30 does not exist in Paris that night: the gap's window is 03:30 local.
    assert paris.next_after(NOW) == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    assert utc.next_after(NOW) == datetime(2026, 3, 29, 2, 30, tzinfo=UTC)


def test_a_cached_list_cannot_be_changed_by_a_caller() -> None:
    schedule = CronSchedule("* * * * *", "UTC")
    first = schedule.last_windows(datetime(2026, 3, 29, 0, 50, tzinfo=UTC), NOW, 3)
    first.clear()
    assert len(schedule.last_windows(datetime(2026, 3, 29, 0, 50, tzinfo=UTC), NOW, 3)) == 3


def test_a_bad_expression_is_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(ScheduleError, match="61"):
            parse_cron("61 * * * *")
    with pytest.raises(ScheduleError, match="expected a string"):
        parse_cron(["* * * * *"])  # type: ignore[arg-type]


def test_rows_with_the_same_schedule_columns_share_one_schedule() -> None:
    from types import SimpleNamespace

    from celery_routines.schedules.parse import schedule_of

    def row(**columns: object) -> SimpleNamespace:
        return SimpleNamespace(**{"cron": None, "interval_seconds": None, **columns})

    first = schedule_of(row(cron="*/5 * * * *"), "Europe/Rome")
    assert schedule_of(row(cron="*/5 * * * *"), "Europe/Rome") is first
    assert schedule_of(row(cron="*/5 * * * *"), "UTC") is not first
    assert schedule_of(row(interval_seconds=60), "UTC") is not schedule_of(
        row(interval_seconds=60.0), "UTC"
    )
    # A row bounded by instants gets a schedule of its own.
    starts = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    bounded = schedule_of(row(cron="*/5 * * * *", starts_at=starts), "Europe/Rome")
    assert bounded is not first and bounded != first
    for _ in range(2):  # an error is raised each time, never kept
        with pytest.raises(ScheduleError):
            schedule_of(row(cron="*/5 * * * *"), "Not/AZone")
