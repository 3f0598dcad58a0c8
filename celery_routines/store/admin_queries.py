"""Queries for the operator surface (``celery routines``, :mod:`celery_routines.operator.admin`).

Read-mostly: listings across routines and runs, and the two writes operators
make on a routine (pause, resume). Every value is a bound parameter, so a
routine called ``x'; DROP TABLE routines; --`` is only a name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Select, and_, case, func, select, update

from .connections import Connections, connections_for
from .dialects import is_mysql
from .models import ROUTINE_RUNS, ROUTINES
from .records import RUN_RECORD_FIELDS, RunRecord

routines = ROUTINES
runs = ROUTINE_RUNS
RUN_COLUMNS = [runs.c[name] for name in RUN_RECORD_FIELDS]


@dataclass(frozen=True)
class NamedRun:
    """A run with the name of its routine (listings span routines)."""

    routine_name: str
    run: RunRecord
    max_attempts: int | None = None
    """``1 + max_retries`` of the routine as it is stored now."""


def _run(row: Any) -> RunRecord:
    return RunRecord(**{name: row._mapping[name] for name in RUN_RECORD_FIELDS})


def _named(row: Any) -> NamedRun:
    return NamedRun(
        routine_name=row._mapping["routine_name"],
        run=_run(row),
        max_attempts=row._mapping["routine_max_retries"] + 1,
    )


def pause_routine(db: Connections, routine_id: int, reason: str | None, now: datetime) -> bool:
    """Pause the routine with ``reason`` unless it is already paused; True if
    this call paused it (an operator's pause and an automatic one alike)."""
    stmt = (
        update(routines)
        .where(routines.c.id == routine_id, routines.c.paused.is_(False))
        .values(paused=True, paused_reason=reason, updated_at=now)
    )
    with db.write() as conn:
        return conn.execute(stmt).rowcount == 1


class AdminQueries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.db = connections_for(engine)

    # -- run listings --------------------------------------------------------

    def runs_select(
        self,
        *,
        routine_id: int | None = None,
        states: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 50,
    ) -> Select[Any]:
        """The listing query. Across routines it is a backward range scan of
        ``ix_routine_runs_created``, or for skips alone of the partial
        ``ix_routine_runs_skipped_created``; for one routine, of
        ``ix_routine_runs_routine_created``."""
        query = select(
            routines.c.name.label("routine_name"),
            routines.c.max_retries.label("routine_max_retries"),
            *RUN_COLUMNS,
        ).join(routines, routines.c.id == runs.c.routine_id)
        if routine_id is not None:
            query = query.where(runs.c.routine_id == routine_id)
        wanted = list(states or ())
        if len(wanted) == 1:
            # Spelled "=", not "IN (...)": SQLite matches a partial index's
            # predicate (state = 'skipped') only against an equality.
            query = query.where(runs.c.state == wanted[0])
        elif wanted:
            query = query.where(runs.c.state.in_(wanted))
        if since is not None:
            query = query.where(runs.c.created_at >= since)
        if until is not None:
            query = query.where(runs.c.created_at <= until)
        if routine_id is None and is_mysql(self.engine):
            # MariaDB's optimizer prefers starting from the few routines and
            # sorting every run they join, or a full scan and a sort, to
            # walking an index for a LIMIT (measured on 2,000 runs, limit 50).
            # STRAIGHT_JOIN starts from the runs, the hint walks the listing's
            # index in order, and each run looks its routine up.
            index = (
                "ix_routine_runs_skipped_created"
                if wanted == ["skipped"]
                else "ix_routine_runs_created"
            )
            query = (
                query.prefix_with("STRAIGHT_JOIN")
                .select_from(runs)
                .with_hint(runs, f"FORCE INDEX FOR ORDER BY ({index})", "*")
            )
        return query.order_by(
            runs.c.created_at.desc(), runs.c.scheduled_for.desc(), runs.c.attempt.desc()
        ).limit(limit)

    def runs(
        self,
        *,
        routine_id: int | None = None,
        states: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 50,
    ) -> list[NamedRun]:
        """Newest first; ``since`` and ``until`` filter on when the row was written."""
        query = self.runs_select(
            routine_id=routine_id, states=states, since=since, until=until, limit=limit
        )
        with self.db.read() as conn:
            return [_named(row) for row in conn.execute(query)]

    def latest_runs(self) -> dict[int, RunRecord]:
        """The newest run row of every routine that has one (for "last outcome").

        One correlated lookup per routine, each a backward walk of the
        ``(routine_id, created_at)`` index: the cost follows the number of
        routines, not the size of the run history.
        """
        newest = (
            select(runs.c.id)
            .where(runs.c.routine_id == routines.c.id)
            .order_by(runs.c.created_at.desc(), runs.c.attempt.desc(), runs.c.id.desc())
            .limit(1)
            .correlate(routines)
            .scalar_subquery()
        )
        query = select(*RUN_COLUMNS).select_from(routines.join(runs, runs.c.id == newest))
        with self.db.read() as conn:
            return {row.routine_id: _run(row) for row in conn.execute(query)}

    def next_retries(self) -> dict[int, RunRecord]:
        """The ``retrying`` run of each routine whose ``retry_at`` comes first.

        Reads ``ix_routine_runs_retry_due``: retrying rows are few (failed
        attempts waiting), whatever the size of the run history.
        """
        query = (
            select(*RUN_COLUMNS)
            .where(runs.c.state == "retrying", runs.c.retry_at.is_not(None))
            .order_by(runs.c.retry_at, runs.c.id)
        )
        found: dict[int, RunRecord] = {}
        with self.db.read() as conn:
            for row in conn.execute(query):
                found.setdefault(row.routine_id, _run(row))
        return found

    def attempts(self, routine_id: int, idempotency_key: str) -> list[RunRecord]:
        """Every attempt of one window, oldest attempt first."""
        query = (
            select(*RUN_COLUMNS)
            .where(runs.c.routine_id == routine_id, runs.c.idempotency_key == idempotency_key)
            .order_by(runs.c.attempt)
        )
        with self.db.read() as conn:
            return [_run(row) for row in conn.execute(query)]

    # -- operator writes -----------------------------------------------------

    def pause(self, routine_id: int, now: datetime, reason: str | None = None) -> bool:
        """True if the routine was running and is now paused (with ``reason``)."""
        return pause_routine(self.db, routine_id, reason, now)

    def resume(
        self, routine_id: int, next_run_at: datetime | None, now: datetime, *, keep_next: bool
    ) -> bool:
        """True if the routine was paused and now runs again.

        Unless ``keep_next``, the next window is replaced by ``next_run_at``
        (computed from now by the caller), so the paused windows are not due.
        """
        # An automatic pause's reason goes; its failures no longer count.
        values: dict[str, object] = {
            "paused": False,
            "paused_reason": None,
            "failures_counted_from": now,
            "updated_at": now,
        }
        if not keep_next:
            values["next_run_at"] = next_run_at
        stmt = (
            update(routines)
            .where(routines.c.id == routine_id, routines.c.paused.is_(True))
            .values(**values)
        )
        with self.db.write() as conn:
            return conn.execute(stmt).rowcount == 1

    def window_runs_between(self, routine_id: int, first: datetime, last: datetime) -> int:
        """How many windows in ``[first, last]`` already have a first attempt
        (manual sends excluded): a backfill preview's count over a range too
        large to list key by key. One index range scan."""
        query = select(func.count()).where(
            runs.c.routine_id == routine_id,
            runs.c.attempt == 1,
            runs.c.scheduled_for >= first,
            runs.c.scheduled_for <= last,
            ~runs.c.idempotency_key.contains("@manual:", autoescape=True),
        )
        with self.db.read() as conn:
            return int(conn.execute(query).scalar_one())

    def routine_counts(self, now: datetime) -> tuple[int, int]:
        """How many routines are suspended, and how many are due, at ``now``
        (the metrics gauges): one scan of ``routines``."""
        # COUNT(CASE ...), not COUNT(*) FILTER (...): MySQL has no FILTER.
        is_due = and_(routines.c.enabled, ~routines.c.paused, routines.c.next_run_at <= now)
        query = select(
            func.count(case((routines.c.suspended_until > now, 1))),
            func.count(case((is_due, 1))),
        )
        with self.db.read() as conn:
            suspended, due = conn.execute(query).one()
        return int(suspended), int(due)
