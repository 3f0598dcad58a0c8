"""What beat's run metrics read: the runs finished since the last read (a
range scan of ``ix_routine_runs_finished``) and the workers' events past the
last id seen (a primary key range scan), and the worker's own note of an
event. Counted in the database, so every worker process is counted once.

Events are pruned with the run history (``routines_keep_runs_days``): a beat
reads only events past the newest id it found at its start, so an old event
is never read again."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, delete, func, insert, literal, select

from .connections import connections_for
from .models import ROUTINE_RUNS, ROUTINE_WORKER_EVENTS, ROUTINES

runs, routines, events = ROUTINE_RUNS, ROUTINES, ROUTINE_WORKER_EVENTS

DUPLICATE = "duplicate"
SUSPENDED = "suspended"


@dataclass(frozen=True)
class FinishedRun:
    routine: str
    state: str
    scheduled_for: datetime
    started_at: datetime | None
    finished_at: datetime


@dataclass(frozen=True)
class WorkerEvent:
    id: int
    routine: str
    kind: str


class RunMetricsQueries:
    def __init__(self, engine: Engine) -> None:
        self.db = connections_for(engine)

    def note(self, run_id: str, kind: str, at: datetime) -> None:
        """A worker's event on ``run_id`` (its routine read from the run row)."""
        routine_id = select(runs.c.routine_id).where(runs.c.id == run_id).scalar_subquery()
        stmt = insert(events).values(routine_id=routine_id, run_id=run_id, kind=kind, at=at)
        with self.db.write() as conn:
            conn.execute(stmt)

    def last_event_id(self) -> int:
        with self.db.read() as conn:
            return int(conn.execute(select(func.coalesce(func.max(events.c.id), 0))).scalar_one())

    def since(
        self, after: datetime, until: datetime, last_event: int, limit: int = 50_000
    ) -> tuple[list[FinishedRun], list[WorkerEvent]]:
        """Runs finished in ``(after, until]`` and worker events past ``last_event``,
        in one read transaction."""
        finished = (
            select(
                routines.c.name,
                runs.c.state,
                runs.c.scheduled_for,
                runs.c.started_at,
                runs.c.finished_at,
            )
            .join(routines, routines.c.id == runs.c.routine_id)
            .where(runs.c.finished_at > after, runs.c.finished_at <= until)
            .where(runs.c.state != "skipped")
            .limit(limit)
        )
        noted = (
            select(events.c.id, func.coalesce(routines.c.name, literal("?")), events.c.kind)
            .outerjoin(routines, routines.c.id == events.c.routine_id)
            .where(events.c.id > last_event)
            .order_by(events.c.id)
            .limit(limit)
        )
        with self.db.read() as conn:
            done = [FinishedRun(*row) for row in conn.execute(finished)]
            seen = [WorkerEvent(*row) for row in conn.execute(noted)]
        return done, seen

    def prune_events(self, cutoff: datetime, limit: int) -> int:
        """Delete at most ``limit`` worker events older than ``cutoff``, oldest
        first (ids grow with time); how many went."""
        # The newest id to delete, found first: MySQL refuses a LIMIT inside
        # IN (...) and a subquery on the table being deleted from.
        oldest = select(events.c.id).where(events.c.at < cutoff).order_by(events.c.id).limit(limit)
        with self.db.read() as conn:
            ids = list(conn.scalars(oldest))
        if not ids:
            return 0
        with self.db.write() as conn:
            return int(
                conn.execute(
                    delete(events).where(events.c.id <= ids[-1], events.c.at < cutoff)
                ).rowcount
            )
