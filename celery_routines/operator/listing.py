"""The admin API's reads for the panel: a page of routines with a strip of
their newest runs, who owns a routine, and how late its sends went out.

``Routines.listing`` (:class:`celery_routines.operator.admin.Routines`); the SQL is in
:mod:`celery_routines.store.panel_queries`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery_routines.clock import Clock
from celery_routines.config import Settings
from celery_routines.errors import ScheduleError
from celery_routines.operator.lookup import RoutineLookup
from celery_routines.operator.views import RoutineSummary
from celery_routines.operator.windows import check_count
from celery_routines.schedules.base import Schedule
from celery_routines.schedules.marks import dst_note
from celery_routines.schedules.parse import schedule_from_columns
from celery_routines.store import RoutineRecord, Store
from celery_routines.store.panel_queries import ROUTINE_STATES, RecentRun
from celery_routines.store.routine_stats import LIST_SORTS

MAX_PER_PAGE = 500
STRIP = 30
# The list sorted by failure rate or lateness measures the last week.
SORT_DAYS = 7


@dataclass(frozen=True)
class StripCell:
    """One run row of a routine's strip: its window and how it ended."""

    run_id: str
    state: str
    scheduled_for: datetime
    attempt: int
    reason: str | None = None


@dataclass(frozen=True)
class RoutineRow:
    summary: RoutineSummary
    owner: str
    """``code (app proj)`` (declared in that app's code), ``cli`` or ``sql``."""
    recent: list[StripCell] = field(default_factory=list)
    """The newest runs, newest first (at most 30)."""
    next_note: str | None = None
    """The DST note of the next window (``shifted: 02:30 does not exist``)."""
    suspended_until: datetime | None = None
    suspended_reason: str | None = None
    error: str | None = None
    """Why the routine is invalid, when it is."""
    failure_rate: float | None = None
    lateness_seconds: float | None = None
    """When the page is sorted: over the last ``SORT_DAYS``, the share of
    ended windows that failed and the mean seconds a window was sent late."""


@dataclass(frozen=True)
class RoutinePage:
    rows: list[RoutineRow]
    total: int
    page: int
    per_page: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))


@dataclass(frozen=True)
class LatenessPoint:
    scheduled_for: datetime
    sent_at: datetime
    seconds: float
    """How long after its window the message went out."""


def owner_of(record: RoutineRecord) -> str:
    """``code (app proj)`` for a routine declared in code (retired only by
    that app), ``cli`` or ``sql`` for rows written by a command or by hand."""
    if record.source == "code":
        return f"code (app {record.owner})" if record.owner else "code"
    return record.source or "sql"


def _figures(found: tuple[float | None, float | None] | None) -> dict[str, float | None]:
    if found is None:
        return {}
    return {"failure_rate": found[0], "lateness_seconds": found[1]}


def strip_cell(run: RecentRun) -> StripCell:
    return StripCell(run.id, run.state, run.scheduled_for, run.attempt, run.reason)


@functools.lru_cache(maxsize=4096)
def _note(cron: str | None, interval: float | None, zone: str, window: datetime) -> str | None:
    """The DST note of one window: parsing a cron costs more than the rest
    of a routine's row, and a refreshed page asks for the same ones again."""
    try:
        return dst_note(_schedule(cron, interval, zone), window)
    except ScheduleError:
        return None


@functools.lru_cache(maxsize=1024)
def _schedule(cron: str | None, interval: float | None, zone: str) -> Schedule:
    return schedule_from_columns(cron, interval, zone)


class RoutineListing:
    """The panel's reads (``Routines.listing``)."""

    def __init__(
        self, lookup: RoutineLookup, store: Store, settings: Settings, clock: Clock
    ) -> None:
        self.lookup = lookup
        self.store = store
        self.settings = settings
        self.clock = clock

    def page(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        page: int = 1,
        per_page: int = 50,
        strip: int = STRIP,
        sort: str | None = None,
    ) -> RoutinePage:
        """One page of routines by name, filtered by state (``active``,
        ``paused``, ``suspended``, ``invalid``, ``disabled``) and by a part of
        the name, each with its newest ``strip`` runs: three queries whatever
        the number of routines and runs."""
        check_count("page", page, 1_000_000)
        check_count("per_page", per_page, MAX_PER_PAGE)
        check_count("strip", strip, 100)
        if state and state not in ROUTINE_STATES:
            raise ValueError(f"state {state!r} is unknown; use one of {', '.join(ROUTINE_STATES)}")
        if sort and sort not in LIST_SORTS:
            raise ValueError(f"sort {sort!r} is unknown; sort by {' or '.join(LIST_SORTS)}")
        now = self.clock()
        found = self.store.panel.routine_page(
            now=now, state=state or None, name=name or None, offset=(page - 1) * per_page,
            limit=per_page, sort=sort or None, sort_since=now - timedelta(days=SORT_DAYS),
        )  # fmt: skip
        recent = self.store.panel.recent_runs([r.id for r in found.records], strip)
        rows = []
        for record in found.records:
            runs = recent.get(record.id, [])
            rows.append(
                RoutineRow(
                    summary=self.lookup.summary(record, runs[0] if runs else None, now),
                    owner=owner_of(record),
                    recent=[strip_cell(run) for run in runs],
                    next_note=self._next_note(record),
                    suspended_until=record.suspended_until,
                    suspended_reason=record.suspended_reason,
                    error=record.last_error,
                    **_figures(found.figures.get(record.id)),
                )
            )
        return RoutinePage(rows, found.total, page, per_page)

    def _next_note(self, record: RoutineRecord) -> str | None:
        if record.next_run_at is None or record.last_error is not None:
            return None
        zone = record.timezone or self.settings.timezone
        return _note(record.cron, record.interval_seconds, zone, record.next_run_at)

    def owner(self, name: str) -> str:
        """Where the routine's definition comes from: ``code (app proj)``,
        ``cli`` or ``sql``."""
        return owner_of(self.lookup.record(name))

    def lateness(self, name: str, hours: float = 24) -> list[LatenessPoint]:
        """How late each window of the last ``hours`` was sent (the first
        attempt of each scheduled window), oldest first."""
        record = self.lookup.record(name)
        since = self.clock() - timedelta(hours=hours)
        return [
            LatenessPoint(window, sent, (sent - window).total_seconds())
            for window, sent in self.store.panel.lateness(record.id, since)
        ]
