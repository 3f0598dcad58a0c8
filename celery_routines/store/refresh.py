"""Routines changed outside beat (plain SQL, another tool): found by their
schedule fingerprint (see :mod:`celery_routines.store.fingerprint`) and
rescheduled, so a stale ``next_run_at`` never fires."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, Label, and_, or_, select, update

from .connections import connections_for
from .fingerprint import current_fingerprint, record_columns, schedule_changed
from .models import ROUTINES
from .records import RoutineRecord

table = ROUTINES
c = table.c


def needs_refresh() -> ColumnElement[bool]:
    """Changed since its window was computed, or scheduled and never
    fingerprinted (rows from before the fingerprint existed)."""
    return or_(schedule_changed(), _never_fingerprinted())


def _never_fingerprinted() -> ColumnElement[bool]:
    return and_(
        c.schedule_fingerprint.is_(None), c.next_run_at.is_not(None), c.retired_at.is_(None)
    )


@dataclass(frozen=True)
class Baselined:
    """One slice of the baseline: rows fingerprinted, and the id the slice
    ended at (None: it reached the end of the table)."""

    written: int
    last_id: int | None


class RefreshQueries:
    def __init__(self, engine: Engine) -> None:
        self.db = connections_for(engine)

    def changed_column(self) -> Label[bool]:
        """For the probe: are there routines to refresh?"""
        return select(c.id).where(needs_refresh()).exists().label("changed")

    def baseline(
        self, now: datetime, holder: str, arbitration: datetime, *, after: int, limit: int
    ) -> Baselined:
        """Fingerprint the next ``limit`` scheduled rows that have none, in id
        order after ``after`` (rows inserted by SQL with their own
        ``next_run_at``, or stored before the fingerprint existed): their
        window stands as it is. A slice, not the table: one UPDATE of a
        million such rows held beat 20 s before its first send, and locked
        every row it touched from the other beats' claims meanwhile (one
        UPDATE per row, before that, cost a burst of 10,000 such routines a
        third of its time). Two statements (the slice's last id, then the
        range): MySQL refuses a LIMIT inside ``IN (...)`` and an UPDATE that
        reads its own table."""
        bound = (
            select(c.id)
            .where(_never_fingerprinted(), c.id > after)
            .order_by(c.id)
            .offset(limit - 1)
            .limit(1)
        )
        free = or_(c.locked_until.is_(None), c.locked_until < arbitration, c.locked_by == holder)
        with self.db.fast_read() as conn:
            last = conn.execute(bound).scalar()
        in_slice = c.id > after if last is None else and_(c.id > after, c.id <= last)
        stmt = (
            update(table)
            .where(in_slice, _never_fingerprinted(), free)
            .values(schedule_fingerprint=current_fingerprint(), updated_at=now)
        )
        with self.db.fast_write() as conn:
            written = int(conn.execute(stmt).rowcount or 0)
        return Baselined(written, last)

    def changed(self, limit: int) -> list[RoutineRecord]:
        query = select(*record_columns()).where(needs_refresh()).order_by(c.id).limit(limit)
        with self.db.fast_read() as conn:
            return [RoutineRecord(*row) for row in conn.execute(query)]

    def reschedule(
        self,
        routine_id: int,
        next_run_at: datetime | None,
        now: datetime,
        holder: str,
        arbitration: datetime,
        *,
        error: str | None = None,
    ) -> bool:
        """Store a recomputed next window (or keep it: ``next_run_at`` None
        only re-fingerprints) with the fingerprint of the row as it is now,
        unless another beat holds the routine (its claim-time check, or the
        next refresh, deals with it then)."""
        values: dict[str, Any] = {"schedule_fingerprint": current_fingerprint(), "updated_at": now}
        if next_run_at is not None:
            values.update(next_run_at=next_run_at, last_error=error)
        free = or_(c.locked_until.is_(None), c.locked_until < arbitration, c.locked_by == holder)
        stmt = update(table).where(c.id == routine_id, free).values(**values)
        if next_run_at is not None:
            stmt = stmt.values(locked_by=None, locked_until=None)
        with self.db.fast_write() as conn:
            return bool(conn.execute(stmt).rowcount)
