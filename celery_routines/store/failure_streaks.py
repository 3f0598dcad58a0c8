"""Consecutive final failures of a routine, and the pause they call for
(``pause_after_failures``); where its notifications go (``notify_url``).

Counted from the run rows when a final failure is recorded (a rare event),
not kept as a counter: a success would otherwise have to write the routine
row too, on every run. A final failure is a ``failed`` or ``lost`` attempt
with no later attempt of its window (its retries, if any, are spent), that
finished after the routine's last success and after ``failures_counted_from``
(set by ``resume``, so a resumed routine counts afresh).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, and_, exists, func, select

from ..policy.states import RunState
from .admin_queries import pause_routine
from .connections import connections_for
from .models import ROUTINE_RUNS, ROUTINES

runs = ROUTINE_RUNS
routines = ROUTINES
# How many of the failures the reason of an automatic pause names.
NAMED_FAILURES = 5


@dataclass(frozen=True)
class Streak:
    count: int
    # The newest first: (idempotency key, state) of each, at most NAMED_FAILURES.
    failures: list[tuple[str, str]]


class FailureStreakQueries:
    def __init__(self, engine: Engine) -> None:
        self.db = connections_for(engine)

    def streak(self, routine_id: int) -> Streak:
        """The routine's final failures since its last success (or resume)."""
        later = runs.alias("later")
        with self.db.read() as conn:
            since = conn.execute(
                select(func.max(runs.c.finished_at)).where(
                    runs.c.routine_id == routine_id, runs.c.state == RunState.SUCCEEDED
                )
            ).scalar_one_or_none()
            counted_from = conn.execute(
                select(routines.c.failures_counted_from).where(routines.c.id == routine_id)
            ).scalar_one_or_none()
            starts = [instant for instant in (since, counted_from) if instant is not None]
            finished = func.coalesce(runs.c.finished_at, runs.c.created_at)
            query = (
                select(runs.c.idempotency_key, runs.c.state)
                .where(
                    runs.c.routine_id == routine_id,
                    runs.c.state.in_((RunState.FAILED, RunState.LOST)),
                    ~exists().where(
                        and_(
                            later.c.routine_id == runs.c.routine_id,
                            later.c.idempotency_key == runs.c.idempotency_key,
                            later.c.attempt > runs.c.attempt,
                        )
                    ),
                )
                .order_by(finished.desc())
            )
            if starts:
                query = query.where(finished > max(starts))
            rows = conn.execute(query).all()
        return Streak(len(rows), [(row[0], row[1]) for row in rows[:NAMED_FAILURES]])

    def pause(self, routine_id: int, reason: str, now: datetime) -> bool:
        """Pause with ``reason`` unless already paused; True if this call paused it."""
        return pause_routine(self.db, routine_id, reason, now)

    def notify_url(self, name: str) -> str | None:
        """The routine's own ``notify_url`` (None: none, or no such routine)."""
        with self.db.read() as conn:
            return conn.execute(
                select(routines.c.notify_url).where(routines.c.name == name)
            ).scalar_one_or_none()
