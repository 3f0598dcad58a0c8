"""A routine's record for the panel and the API (issue 33, item 5).

A collaborator of :class:`celery_routines.operator.admin.Routines`, like
:class:`~celery_routines.operator.bulk.BulkActions`: it reads the routine
through the store, reads the clock once, and hands the pure summariser
(:mod:`celery_routines.policy.run_stats`) what the store's one statement
(:mod:`celery_routines.store.routine_stats`) returns.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from celery_routines.config import Settings
from celery_routines.errors import UnknownRoutine
from celery_routines.policy.run_stats import (
    DEFAULT_DAYS,
    STRIP_DAYS,
    RoutineStats,
    check_days,
    strip_days,
    summarise,
)
from celery_routines.store import Store
from celery_routines.store.routine_stats import RoutineStatsQueries


class StatsSource(Protocol):
    """What the record needs of the admin API."""

    store: Store
    settings: Settings

    def clock(self) -> datetime: ...


class RoutineRecords:
    def __init__(self, routines: StatsSource) -> None:
        self.routines = routines
        self.queries = RoutineStatsQueries(routines.store.engine)

    def of(self, name: str, days: int | str | None = DEFAULT_DAYS) -> RoutineStats:
        """The record of ``name`` over the last ``days`` (1..90) and its strip
        of the last 30 days in its zone: one query."""
        record = self.routines.store.routines.by_name(name)
        if record is None:
            raise UnknownRoutine(name)
        period = check_days(days, name)
        now = self.routines.clock()
        zone = record.timezone or self.routines.settings.timezone
        bounds = strip_days(now, zone, STRIP_DAYS)
        since = now - timedelta(days=period)
        # Runs written up to now (a clock read at the edge, passed down).
        until = now + timedelta(microseconds=1)
        groups, spreads, strip = self.queries.stats(
            record.id, since, until, [start for _, start in bounds]
        )
        return summarise(
            record.name, zone, period, since, now, groups, spreads,
            [day for day, _ in bounds[:-1]], strip,
        )  # fmt: skip
