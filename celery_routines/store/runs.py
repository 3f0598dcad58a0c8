"""Every query on the ``routine_runs`` table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite

from .models import OPEN_STATES, RoutineRun
from .records import RUN_RECORD_FIELDS, NewRun, RunRecord

table = RoutineRun.__table__
c = table.c
RECORD_COLUMNS = [c[name] for name in RUN_RECORD_FIELDS]
STARTABLE_STATES = ("pending", "sent")


def _record(row: Any) -> RunRecord:
    return RunRecord(**{name: row._mapping[name] for name in RUN_RECORD_FIELDS})


class RunQueries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert

    # -- beat ----------------------------------------------------------------

    def insert_new(self, runs: Sequence[NewRun], now: datetime) -> set[str]:
        """Write run rows in one statement; return the ids actually inserted.

        The unique ``(routine_id, idempotency_key, attempt)`` is the final
        arbiter of "one window fires once": a row that conflicts is not
        inserted and its id is not returned, whoever else wrote it first.
        (psycopg 3 reports rowcount -1 here, so RETURNING is the only reliable
        answer.)
        """
        if not runs:
            return set()
        stmt = (
            self._insert(table)
            .values([{**asdict(run), "created_at": now} for run in runs])
            .on_conflict_do_nothing(index_elements=["routine_id", "idempotency_key", "attempt"])
            .returning(c.id)
        )
        with self.engine.begin() as conn:
            return {row.id for row in conn.execute(stmt)}

    def find_windows(self, windows: Sequence[tuple[int, str, int]]) -> list[RunRecord]:
        """The stored runs of ``(routine_id, idempotency_key, attempt)`` triples."""
        if not windows:
            return []
        query = select(*RECORD_COLUMNS).where(
            tuple_(c.routine_id, c.idempotency_key, c.attempt).in_(list(windows))
        )
        with self.engine.connect() as conn:
            return [_record(row) for row in conn.execute(query)]

    def mark_sent(self, run_ids: Sequence[str], now: datetime) -> None:
        """``pending`` -> ``sent``; a run the worker already started is left alone."""
        if not run_ids:
            return
        stmt = (
            update(table)
            .where(c.id.in_(run_ids), c.state == "pending")
            .values(state="sent", sent_at=now)
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)

    def mark_send_failed(self, run_id: str, error: str, now: datetime) -> None:
        stmt = (
            update(table)
            .where(c.id == run_id, c.state == "pending")
            .values(state="failed", reason="send_failed", error=error, finished_at=now)
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)

    # -- worker --------------------------------------------------------------

    def claim_start(self, run_id: str, worker: str, now: datetime) -> bool:
        """``pending``/``sent`` -> ``running``; False means someone else has it."""
        stmt = (
            update(table)
            .where(c.id == run_id, c.state.in_(STARTABLE_STATES))
            .values(state="running", started_at=now, worker=worker)
        )
        with self.engine.begin() as conn:
            return conn.execute(stmt).rowcount == 1

    def finish(
        self,
        run_id: str,
        state: str,
        now: datetime,
        *,
        error: str | None = None,
        spend: dict[str, float] | None = None,
    ) -> bool:
        """``running`` -> ``succeeded``/``failed`` with the outcome."""
        stmt = (
            update(table)
            .where(c.id == run_id, c.state == "running")
            .values(
                state=state,
                finished_at=now,
                error=error,
                spend=json.dumps(spend) if spend is not None else None,
            )
        )
        with self.engine.begin() as conn:
            return conn.execute(stmt).rowcount == 1

    def requeue(self, run_id: str) -> None:
        """A task that called Celery's own ``self.retry()`` goes back to ``sent``:
        the redelivery is the same run, not one of our retries."""
        stmt = update(table).where(c.id == run_id, c.state == "running").values(state="sent")
        with self.engine.begin() as conn:
            conn.execute(stmt)

    # -- lookups -------------------------------------------------------------

    def get(self, run_id: str) -> RunRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(*RECORD_COLUMNS).where(c.id == run_id)).first()
        return _record(row) if row else None

    def for_routine(self, routine_id: int, limit: int = 100) -> list[RunRecord]:
        query = (
            select(*RECORD_COLUMNS)
            .where(c.routine_id == routine_id)
            .order_by(c.created_at.desc(), c.scheduled_for.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [_record(row) for row in conn.execute(query)]

    def open_count(self, routine_id: int) -> int:
        query = select(func.count()).where(c.routine_id == routine_id, c.state.in_(OPEN_STATES))
        with self.engine.connect() as conn:
            return conn.execute(query).scalar_one()
