"""Pruning the run history: finished runs older than a cut-off, in batches.

Never deleted: an open run (only finished states are candidates), the newest
run of each routine (a newer run of the same routine must exist), and runs a
ceiling still counts (the caller gives routines with ceilings an earlier
cut-off, the start of their longest period). Candidates are read oldest
first through ``ix_routine_runs_created`` and deleted by primary key, which
works alike on SQLite, PostgreSQL and MySQL/MariaDB (MySQL refuses a
``LIMIT`` inside ``IN (...)`` and a subquery on the table being deleted from).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, and_, delete, exists, func, or_, select

from ..policy.states import FINISHED_STATES
from .connections import connections_for
from .models import ROUTINE_RUNS, ROUTINES

runs = ROUTINE_RUNS
c = runs.c
routines = ROUTINES
newer = runs.alias("newer")
# Ids deleted per DELETE statement (SQLite's bound-parameter limit, short locks).
DELETE_CHUNK = 1000


def _prunable(cutoff: datetime, cutoffs: Mapping[int, datetime]) -> ColumnElement[bool]:
    """Finished, older than the cut-off (a routine's own when it has one),
    and not its routine's newest run."""
    has_newer = exists(
        select(newer.c.id).where(
            newer.c.routine_id == c.routine_id, newer.c.created_at > c.created_at
        )
    )
    by_routine: list[ColumnElement[bool]] = [c.created_at < cutoff]
    if cutoffs:
        groups: dict[datetime, list[int]] = {}
        for routine_id, own in cutoffs.items():
            groups.setdefault(min(own, cutoff), []).append(routine_id)
        special = list(cutoffs)
        by_routine = [and_(c.created_at < cutoff, c.routine_id.not_in(special))]
        by_routine += [
            and_(c.created_at < at, c.routine_id.in_(ids)) for at, ids in sorted(groups.items())
        ]
    return and_(c.state.in_(FINISHED_STATES), or_(*by_routine), has_newer)


class PruneQueries:
    def __init__(self, engine: Engine) -> None:
        self.db = connections_for(engine)

    def ceilings(self) -> list[tuple[int, str, str | None]]:
        """``(id, ceiling JSON, timezone)`` of every routine with a ceiling."""
        query = select(routines.c.id, routines.c.ceiling, routines.c.timezone).where(
            routines.c.ceiling.is_not(None)
        )
        with self.db.read() as conn:
            return [(row.id, row.ceiling, row.timezone) for row in conn.execute(query)]

    def count(self, cutoff: datetime, cutoffs: Mapping[int, datetime]) -> dict[str, int]:
        """What pruning would delete, by state (a dry run)."""
        query = select(c.state, func.count()).where(_prunable(cutoff, cutoffs)).group_by(c.state)
        with self.db.read() as conn:
            return {row[0]: int(row[1]) for row in conn.execute(query)}

    def prune(
        self, cutoff: datetime, cutoffs: Mapping[int, datetime], limit: int
    ) -> dict[str, int]:
        """Delete at most ``limit`` prunable runs, oldest first; the count by state."""
        query = (
            select(c.id, c.state)
            .where(_prunable(cutoff, cutoffs))
            .order_by(c.created_at)
            .limit(limit)
        )
        with self.db.read() as conn:
            found = [(row.id, row.state) for row in conn.execute(query)]
        return self._delete(found)

    def _delete(self, found: Sequence[tuple[str, Any]]) -> dict[str, int]:
        deleted: Counter[str] = Counter()
        for start in range(0, len(found), DELETE_CHUNK):
            chunk = found[start : start + DELETE_CHUNK]
            ids = [run_id for run_id, _ in chunk]
            with self.db.write() as conn:
                # Finished runs never change state again; the condition only
                # keeps a row that did (a bug elsewhere) out of the delete.
                done = conn.execute(
                    delete(runs).where(c.id.in_(ids), c.state.in_(FINISHED_STATES))
                ).rowcount
            if done == len(chunk):
                deleted.update(state for _, state in chunk)
            else:
                deleted.update({"unknown": done})
        return dict(deleted)
