"""The worker's queries on ``routine_runs``: claim a run before its body,
count a refused duplicate delivery, record the outcome, requeue a Celery
retry. Each is one conditional UPDATE, so a run changes hands once."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import case, literal, or_, select, update

from .connections import Connections
from .dialects import is_mysql
from .models import RoutineRun
from .types import UTCDateTime

table = RoutineRun.__table__
c = table.c
STARTABLE_STATES = ("pending", "sent")


class RunOutcomeQueries:
    """Part of :class:`celery_routines.store.runs.RunQueries`."""

    db: Connections

    def claim_start(
        self,
        run_id: str,
        worker: str,
        now: datetime,
        *,
        deadline_at: datetime | None = None,
        celery_retries: int = 0,
    ) -> bool:
        """``pending``/``sent`` -> ``running``; False means someone else has it.

        A delivery of Celery's own ``self.retry()`` carries a higher
        ``request.retries`` than the one holding the run, so it may take over
        a ``running`` row; a duplicate of the same delivery may not.
        """
        stmt = (
            update(table)
            .where(
                c.id == run_id,
                or_(
                    c.state.in_(STARTABLE_STATES),
                    (c.state == "running") & (c.celery_retries < celery_retries),
                ),
            )
            .values(
                state="running",
                started_at=now,
                worker=worker,
                deadline_at=deadline_at,
                celery_retries=celery_retries,
            )
        )
        with self.db.write() as conn:
            return conn.execute(stmt).rowcount == 1

    def heartbeat(self, run_id: str, deadline_at: datetime) -> bool:
        """A running body's sign of life: push its ``deadline_at`` to at least
        ``deadline_at`` (a later one, from a hard time limit, is kept).
        False: the run is no longer ``running`` (declared lost, replaced)."""
        new = literal(deadline_at, UTCDateTime())
        stmt = (
            update(table)
            .where(c.id == run_id, c.state == "running")
            .values(deadline_at=case((c.deadline_at > new, c.deadline_at), else_=new))
        )
        with self.db.write() as conn:
            return conn.execute(stmt).rowcount == 1

    def count_duplicate(self, run_id: str) -> str | None:
        """Count a refused delivery on the run; its state, or None if unknown."""
        stmt = update(table).where(c.id == run_id).values(duplicates=c.duplicates + 1)
        if is_mysql(self.db.engine):
            # No RETURNING: the UPDATE locks the row, so the state read after
            # it in the same transaction is the one it counted against.
            with self.db.write() as conn:
                if conn.execute(stmt).rowcount != 1:
                    return None
                return conn.execute(select(c.state).where(c.id == run_id)).scalar_one()
        with self.db.write() as conn:
            row = conn.execute(stmt.returning(c.state)).first()
        return row.state if row is not None else None

    def finish(
        self,
        run_id: str,
        state: str,
        now: datetime,
        *,
        error: str | None = None,
        spend: dict[str, float] | None = None,
    ) -> bool:
        """``running`` -> ``succeeded``/``failed`` with the outcome.

        A success also lands on a run the lost sweep gave up on but whose retry
        has not gone out yet (``retrying``, reason ``lost``): it did finish, and
        taking it out of ``retrying`` cancels the retry.
        """
        values: dict[str, Any] = {
            "state": state,
            "finished_at": now,
            "error": error,
            "spend": json.dumps(spend) if spend is not None else None,
        }
        startable = c.state == "running"
        if state == "succeeded":
            startable = or_(startable, (c.state == "retrying") & (c.reason == "lost"))
            values.update(retry_at=None, reason=None)
        stmt = update(table).where(c.id == run_id, startable).values(**values)
        with self.db.write() as conn:
            return conn.execute(stmt).rowcount == 1

    def requeue(
        self, run_id: str, *, celery_retries: int = 0, deadline_at: datetime | None = None
    ) -> None:
        """A task that called Celery's own ``self.retry()`` goes back to ``sent``:
        the redelivery is the same run, not one of our retries.

        Only while the delivery that retried still holds it: if the redelivery
        already claimed the row, it stays ``running``.
        """
        values: dict[str, Any] = {"state": "sent"}
        if deadline_at is not None:
            values["deadline_at"] = deadline_at
        stmt = (
            update(table)
            .where(c.id == run_id, c.state == "running", c.celery_retries == celery_retries)
            .values(**values)
        )
        with self.db.write() as conn:
            conn.execute(stmt)
