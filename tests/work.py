"""Counting the work a schedule does, for cost tests that cannot flake.

A CPU-time limit fails on a loaded machine and passes a slow algorithm on a
fast one; the number of calendar days whose windows are listed, croniter
steps taken and interval windows iterated says what the algorithm did.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import pytest

from celery_routines.schedules import cronspec
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.interval import IntervalSchedule


@dataclass
class ScheduleWork:
    days_listed: int = 0  # calendar days whose every window was built
    croniter_steps: int = 0
    interval_windows: int = 0  # windows an interval schedule iterated one by one

    def reset(self) -> None:
        self.days_listed = self.croniter_steps = self.interval_windows = 0


def count_schedule_work(monkeypatch: pytest.MonkeyPatch) -> ScheduleWork:
    work = ScheduleWork()
    day_instants = CronSchedule._day_instants
    interval_windows = IntervalSchedule.windows

    def listing_a_day(self: CronSchedule, day: date, *args: Any) -> list[datetime]:
        work.days_listed += 1
        return day_instants(self, day, *args)

    def iterating(self: IntervalSchedule, after: datetime, until: datetime) -> Iterator[datetime]:
        for window in interval_windows(self, after, until):
            work.interval_windows += 1
            yield window

    class CountingCroniter(cronspec.croniter):  # type: ignore[misc]
        def get_next(self, *args: Any, **kwargs: Any) -> Any:
            work.croniter_steps += 1
            return super().get_next(*args, **kwargs)

        def get_prev(self, *args: Any, **kwargs: Any) -> Any:
            work.croniter_steps += 1
            return super().get_prev(*args, **kwargs)

    monkeypatch.setattr(CronSchedule, "_day_instants", listing_a_day)
    monkeypatch.setattr(IntervalSchedule, "windows", iterating)
    monkeypatch.setattr(cronspec, "croniter", CountingCroniter)
    return work
