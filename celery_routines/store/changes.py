"""Routines managed without code (``celery routines add/edit/...``) and the
``routine_changes`` log of who changed what and when."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, delete, func, select, update

from .connections import connections_for
from .fingerprint import current_fingerprint
from .models import ROUTINE_CHANGES, ROUTINE_RUNS, ROUTINES

routines = ROUTINES
changes = ROUTINE_CHANGES
runs = ROUTINE_RUNS


@dataclass(frozen=True)
class ChangeRecord:
    id: int
    routine: str
    action: str
    changed_by: str | None
    changed_at: datetime
    detail: dict[str, Any] | None


def _change(row: Any) -> ChangeRecord:
    try:
        detail = json.loads(row.detail) if row.detail else None
    except ValueError:
        detail = {"text": row.detail}
    return ChangeRecord(row.id, row.routine, row.action, row.changed_by, row.changed_at, detail)


class ChangeQueries:
    def __init__(self, engine: Engine) -> None:
        self.db = connections_for(engine)

    def record(
        self,
        routine: str,
        action: str,
        by: str | None,
        now: datetime,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        values = {
            "routine": routine,
            "action": action,
            "changed_by": by,
            "changed_at": now,
            "detail": json.dumps(dict(detail), default=str) if detail else None,
        }
        with self.db.write() as conn:
            conn.execute(changes.insert().values(**values))

    def history(self, routine: str, limit: int) -> list[ChangeRecord]:
        """The routine's changes, newest first (through ``ix_routine_changes_routine``)."""
        query = (
            select(changes)
            .where(changes.c.routine == routine)
            .order_by(changes.c.id.desc())
            .limit(limit)
        )
        with self.db.read() as conn:
            return [_change(row) for row in conn.execute(query)]

    # -- routines without code ----------------------------------------------

    def insert_routine(self, columns: Mapping[str, Any], source: str, now: datetime) -> int:
        values = {**columns, "source": source, "created_at": now, "updated_at": now}
        with self.db.write() as conn:
            result = conn.execute(routines.insert().values(**values))
            key = result.inserted_primary_key
            assert key is not None  # an INSERT of one row always has its key
            return int(key[0])

    def update_routine(
        self, routine_id: int, values: Mapping[str, Any], now: datetime, *, reschedule: bool
    ) -> None:
        """Write changed definition columns; ``reschedule`` (the schedule
        changed, or the routine was enabled) gives it a new first window from
        now at the next tick, the stale one never fires."""
        extra: dict[str, Any] = {"updated_at": now}
        if reschedule:
            extra.update(next_run_at=None, schedule_fingerprint=None, last_error=None)
        with self.db.write() as conn:
            conn.execute(
                update(routines).where(routines.c.id == routine_id).values(**values, **extra)
            )

    def refingerprint(self, routine_id: int) -> None:
        """Store the routine's current schedule fingerprint (after a change
        this process made and dealt with itself; a separate statement, as
        MySQL evaluates ``SET`` assignments left to right)."""
        stmt = (
            update(routines)
            .where(routines.c.id == routine_id)
            .values(schedule_fingerprint=current_fingerprint())
        )
        with self.db.write() as conn:
            conn.execute(stmt)

    def runs_by_state(self, routine_id: int) -> dict[str, int]:
        """How many runs a routine has, by state (what a delete would remove)."""
        query = (
            select(runs.c.state, func.count())
            .where(runs.c.routine_id == routine_id)
            .group_by(runs.c.state)
        )
        with self.db.read() as conn:
            return {state: count for state, count in conn.execute(query)}

    def delete_routine(self, routine_id: int) -> int:
        """Delete a routine and its runs (in one transaction); the runs deleted."""
        with self.db.write() as conn:
            deleted = conn.execute(delete(runs).where(runs.c.routine_id == routine_id)).rowcount
            conn.execute(delete(routines).where(routines.c.id == routine_id))
        return deleted
