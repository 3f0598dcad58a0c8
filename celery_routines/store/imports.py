"""Writing imported routines (``celery routines import ...``).

The importer runs these inside one ``Connections.transaction()``, so an
import is written whole or not at all; new routines and the change records
go in one ``executemany`` each (a thousand routines cost a few round trips,
not two thousand).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select, update

from .connections import connections_for
from .fingerprint import current_fingerprint
from .models import ROUTINE_CHANGES, ROUTINE_RUNS, ROUTINES

routines = ROUTINES
changes = ROUTINE_CHANGES
runs = ROUTINE_RUNS


class ImportQueries:
    def __init__(self, engine: Engine) -> None:
        self.db = connections_for(engine)

    def with_runs(self, routine_ids: Iterable[int]) -> set[int]:
        """The routines among ``routine_ids`` that have at least one run row."""
        ids = list(routine_ids)
        if not ids:
            return set()
        query = select(runs.c.routine_id).where(runs.c.routine_id.in_(ids)).distinct()
        with self.db.read() as conn:
            return {row[0] for row in conn.execute(query)}

    def insert_many(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert routines (each row with the same keys) in one executemany."""
        if not rows:
            return
        with self.db.write() as conn:
            conn.execute(routines.insert(), [dict(row) for row in rows])

    def record_changes(
        self, entries: Sequence[tuple[str, str, Mapping[str, Any]]], by: str, now: datetime
    ) -> None:
        """``routine_changes`` rows (routine, action, detail), in one executemany."""
        if not entries:
            return
        rows = [
            {
                "routine": routine,
                "action": action,
                "changed_by": by,
                "changed_at": now,
                "detail": json.dumps(dict(detail), default=str) if detail else None,
            }
            for routine, action, detail in entries
        ]
        with self.db.write() as conn:
            conn.execute(changes.insert(), rows)

    def update(self, routine_id: int, values: Mapping[str, Any]) -> None:
        with self.db.write() as conn:
            conn.execute(update(routines).where(routines.c.id == routine_id).values(**values))

    def fingerprint(self, names: Iterable[str]) -> None:
        """Store the schedule fingerprint of routines whose ``next_run_at`` the
        import computed (a separate statement: MySQL evaluates ``SET`` left to
        right), so beat's refresh keeps that next window."""
        wanted = list(names)
        if not wanted:
            return
        stmt = (
            update(routines)
            .where(routines.c.name.in_(wanted), routines.c.next_run_at.is_not(None))
            .values(schedule_fingerprint=current_fingerprint())
        )
        with self.db.write() as conn:
            conn.execute(stmt)
