"""Writing imported routines (``celery routines import ...``).

The importer runs these inside one ``Connections.transaction()`` with the
change records, so an import is written whole or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, select, update

from .connections import connections_for
from .fingerprint import current_fingerprint
from .models import Routine, RoutineRun

routines = Routine.__table__
runs = RoutineRun.__table__


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

    def insert(self, values: Mapping[str, Any]) -> int:
        with self.db.write() as conn:
            result = conn.execute(routines.insert().values(**values))
            return int(result.inserted_primary_key[0])

    def update(self, routine_id: int, values: Mapping[str, Any]) -> None:
        with self.db.write() as conn:
            conn.execute(update(routines).where(routines.c.id == routine_id).values(**values))

    def fingerprint(self, routine_ids: Iterable[int]) -> None:
        """Store the schedule fingerprint of routines whose ``next_run_at`` the
        import computed (a separate statement: MySQL evaluates ``SET`` left to
        right), so beat's refresh keeps that next window."""
        ids = list(routine_ids)
        if not ids:
            return
        stmt = (
            update(routines)
            .where(routines.c.id.in_(ids), routines.c.next_run_at.is_not(None))
            .values(schedule_fingerprint=current_fingerprint())
        )
        with self.db.write() as conn:
            conn.execute(stmt)
