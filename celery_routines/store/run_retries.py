"""The ``routine_runs`` queries of retries: the ``retrying`` attempts due,
and handing one over to its next attempt (or dropping it) exactly once.
The store holds them as ``Store.retries``."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Select, select, text, update
from sqlalchemy.dialects import postgresql, sqlite

import celery_routines.store.mysql as mysql_json

from .connections import connections_for
from .dialects import is_mysql
from .fingerprint import record_columns
from .models import ROUTINE_RUNS, ROUTINES
from .records import (
    ROUTINE_RECORD_FIELDS,
    RUN_RECORD_FIELDS,
    DueRetry,
    NewRun,
    RoutineRecord,
    RunRecord,
)

table = ROUTINE_RUNS
c = table.c
routines = ROUTINES
RECORD_COLUMNS = [c[name] for name in RUN_RECORD_FIELDS]
# Spelled exactly like the partial index's predicate: SQLite uses a partial
# index only for a query whose WHERE contains the same term.
RETRYING = text("routine_runs.state = 'retrying'")


def run_record(row: Any) -> RunRecord:
    return RunRecord(**{name: row._mapping[name] for name in RUN_RECORD_FIELDS})


class RunRetryQueries:
    """The retry hand-over's queries on ``routine_runs`` (``Store.retries``)."""

    def __init__(self, engine: Engine) -> None:
        self.db = connections_for(engine)
        self._mysql = is_mysql(engine)
        # The dialect's INSERT with ON CONFLICT (PostgreSQL's or SQLite's).
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert

    def retries_due_select(self, now: datetime, limit: int) -> Select[Any]:
        """``retrying`` attempts whose ``retry_at`` has come, oldest first, with
        their routine: a range scan of ``ix_routine_runs_retry_due``."""
        routine_columns = record_columns("r_")
        return (
            select(*RECORD_COLUMNS, *routine_columns)
            .join(routines, routines.c.id == c.routine_id)
            .where(RETRYING, c.retry_at <= now)
            .order_by(c.retry_at)
            .limit(limit)
        )

    def retries_due(self, now: datetime, limit: int) -> list[DueRetry]:
        with self.db.fast_read() as conn:
            rows = conn.execute(self.retries_due_select(now, limit)).all()
        return [
            DueRetry(
                run=run_record(row),
                routine=RoutineRecord(
                    **{name: row._mapping[f"r_{name}"] for name in ROUTINE_RECORD_FIELDS}
                ),
            )
            for row in rows
        ]

    def take_retry(self, run_id: str, settled: str, next_attempt: NewRun, now: datetime) -> bool:
        """Claim a due retry and write its next attempt, in one transaction.

        The conditional UPDATE ``retrying`` -> ``failed``/``lost`` lets exactly
        one beat through; the unique ``(routine_id, idempotency_key, attempt)``
        backs it up. False: another beat took it (or the row changed).
        """
        claim = update(table).where(c.id == run_id, c.state == "retrying").values(state=settled)
        if self._mysql:
            with self.db.write() as conn:
                if conn.execute(claim).rowcount != 1:
                    return False
                return bool(mysql_json.insert_runs(conn, [next_attempt], now))
        insert = (
            self._insert(table)
            .values([{**asdict(next_attempt), "created_at": now}])
            .on_conflict_do_nothing(index_elements=["routine_id", "idempotency_key", "attempt"])
            .returning(c.id)
        )
        with self.db.write() as conn:
            if conn.execute(claim).rowcount != 1:
                return False
            return conn.execute(insert).first() is not None

    def cancel_retry(self, run_id: str, settled: str, reason: str) -> bool:
        """A due retry of a paused/suspended/disabled routine is dropped, visibly."""
        stmt = (
            update(table)
            .where(c.id == run_id, c.state == "retrying")
            .values(state=settled, reason=reason)
        )
        with self.db.write() as conn:
            return conn.execute(stmt).rowcount == 1

    def postpone_retry(self, run_id: str, retry_at: datetime) -> bool:
        """A due retry held back by another open run of its routine (overlap
        ``skip``/``queue``): looked at again at ``retry_at``."""
        stmt = update(table).where(c.id == run_id, c.state == "retrying").values(retry_at=retry_at)
        with self.db.write() as conn:
            return conn.execute(stmt).rowcount == 1
