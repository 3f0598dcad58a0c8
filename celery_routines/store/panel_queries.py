"""Queries for the panel's pages (:mod:`celery_routines.operator.web`), read
through the admin API: a page of routines filtered by state and name, the
newest runs of every routine on that page in one round trip, and the lateness
of one routine's sends.

Sized for 10,000 routines and a million runs: the page is an ``ORDER BY name``
with a ``LIMIT`` (the unique index on ``name`` walks it), and each routine's
strip is a backward walk of ``ix_routine_runs_routine_created`` that stops
after ``per`` rows, whatever the length of its history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, SupportsFloat

from sqlalchemy import ColumnElement, Engine, and_, func, not_, select, true, union_all

from .connections import connections_for
from .models import ROUTINE_RUNS, ROUTINES
from .records import RoutineRecord
from .routine_stats import LIST_SORTS, list_figures
from .routines import RECORD_COLUMNS, _record

routines = ROUTINES
runs = ROUTINE_RUNS

# The states a routine is filtered by, as the panel names them.
ROUTINE_STATES = ("active", "paused", "suspended", "invalid", "disabled", "retired")


@dataclass(frozen=True)
class RoutineRecordPage:
    records: list[RoutineRecord]
    total: int
    """Routines matching the filters, over every page."""
    figures: dict[int, tuple[float | None, float | None]] = field(default_factory=dict)
    """(failure rate, mean lateness in seconds) by routine id, when sorted by one."""


@dataclass(frozen=True)
class RecentRun:
    """What a routine's strip shows of one run."""

    id: str
    routine_id: int
    state: str
    reason: str | None
    scheduled_for: datetime
    attempt: int
    created_at: datetime


STRIP_COLUMNS = [runs.c[name] for name in RecentRun.__dataclass_fields__]


def state_condition(state: str, now: datetime) -> ColumnElement[bool]:
    """The SQL twin of :func:`celery_routines.operator.views.routine_state`."""
    serving = routines.c.retired_at.is_(None)
    valid = and_(serving, routines.c.last_error.is_(None))
    enabled = and_(valid, routines.c.enabled.is_(True))
    running = and_(enabled, routines.c.paused.is_(False))
    suspended = and_(routines.c.suspended_until.is_not(None), routines.c.suspended_until > now)
    conditions = {
        "retired": routines.c.retired_at.is_not(None),
        "invalid": and_(serving, routines.c.last_error.is_not(None)),
        "disabled": and_(valid, routines.c.enabled.is_(False)),
        "paused": and_(enabled, routines.c.paused.is_(True)),
        "suspended": and_(running, suspended),
        "active": and_(running, not_(suspended)),
    }
    if state not in conditions:
        raise ValueError(f"state {state!r} is unknown; use one of {', '.join(ROUTINE_STATES)}")
    return conditions[state]


def _number(value: SupportsFloat | None) -> float | None:
    """A figure as a float (PostgreSQL's numeric averages read as Decimal),
    to the millisecond: SQLite's julianday() arithmetic is exact to ~50 µs."""
    return None if value is None else round(float(value), 3)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class PanelQueries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.db = connections_for(engine)

    def routine_page(
        self,
        *,
        now: datetime,
        state: str | None = None,
        name: str | None = None,
        offset: int = 0,
        limit: int = 50,
        sort: str | None = None,
        sort_since: datetime | None = None,
    ) -> RoutineRecordPage:
        """Routines by name, ``limit`` from ``offset``; ``name`` matches any
        part of the name, ignoring case (a literal: ``%`` and ``_`` are only
        characters). ``sort`` (``failure_rate`` or ``lateness``, over the runs
        written since ``sort_since``) puts the worst first, in the same query."""
        where: list[ColumnElement[bool]] = []
        if state:
            where.append(state_condition(state, now))
        if name:
            where.append(routines.c.name.ilike(f"%{_escape_like(name)}%", escape="\\"))
        query = select(*RECORD_COLUMNS).where(*where)
        if sort is not None:
            if sort not in LIST_SORTS or sort_since is None:
                raise ValueError(f"sort {sort!r} is unknown; sort by {' or '.join(LIST_SORTS)}")
            figures = list_figures(sort_since)
            by = figures.c[sort]
            query = (
                query.add_columns(figures.c.failure_rate, figures.c.lateness)
                .select_from(routines.outerjoin(figures, figures.c.routine_id == routines.c.id))
                # Worst first; routines with nothing to measure last (portable NULLS LAST).
                .order_by(by.is_(None), by.desc(), routines.c.name)
            )
        else:
            query = query.order_by(routines.c.name)
        query = query.offset(offset).limit(limit)
        count = select(func.count()).select_from(routines).where(*where)
        with self.db.read() as conn:
            rows = list(conn.execute(query))
            total = conn.execute(count).scalar_one()
        width = len(RECORD_COLUMNS)
        found = {row.id: (_number(row[width]), _number(row[width + 1])) for row in rows if sort}
        records = [_record(row[:width]) for row in rows]
        return RoutineRecordPage(records=records, total=total, figures=found)

    def recent_runs(self, routine_ids: Sequence[int], per: int = 30) -> dict[int, list[RecentRun]]:
        """The newest ``per`` run rows of each routine, newest first, in one
        query of one bounded backward walk of ``ix_routine_runs_routine_created``
        per routine: a LATERAL join on PostgreSQL, a UNION ALL elsewhere
        (SQLite and MariaDB have no LATERAL)."""
        if not routine_ids:
            return {}
        wanted = list(dict.fromkeys(routine_ids))
        if self.engine.dialect.name == "postgresql":
            page = select(routines.c.id).where(routines.c.id.in_(wanted)).subquery("page")
            recent = (
                select(*STRIP_COLUMNS)
                .where(runs.c.routine_id == page.c.id)
                .order_by(runs.c.created_at.desc())
                .limit(per)
                .lateral("recent")
            )
            query: Any = select(*recent.c).select_from(page.join(recent, true()))
        else:
            arms = [
                select(*STRIP_COLUMNS)
                .where(runs.c.routine_id == routine_id)
                .order_by(runs.c.created_at.desc())
                .limit(per)
                .subquery()
                for routine_id in wanted
            ]
            query = union_all(*(select(*arm.c) for arm in arms))
        found: dict[int, list[RecentRun]] = {routine_id: [] for routine_id in wanted}
        with self.db.read() as conn:
            for row in conn.execute(query):
                found[row.routine_id].append(RecentRun(*row))
        for rows in found.values():
            rows.sort(key=lambda r: (r.created_at, r.attempt), reverse=True)
        return found

    def lateness(self, routine_id: int, since: datetime) -> list[tuple[datetime, datetime]]:
        """``(scheduled_for, sent_at)`` of the routine's window sends of
        windows since ``since``, oldest first (manual sends and skips have no lateness
        and are left out, as are retries and replays)."""
        query = (
            select(runs.c.scheduled_for, runs.c.sent_at)
            .where(
                runs.c.routine_id == routine_id,
                runs.c.created_at >= since,
                runs.c.scheduled_for >= since,
                runs.c.sent_at.is_not(None),
                runs.c.attempt == 1,
                not_(runs.c.idempotency_key.like("%@manual:%")),
            )
            .order_by(runs.c.created_at)
        )
        with self.db.read() as conn:
            return [(row.scheduled_for, row.sent_at) for row in conn.execute(query)]
