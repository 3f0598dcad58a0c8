"""Writing the routines declared in code: upsert, retirement and revival.

Code owns the definition columns of its routines, the database keeps their
runtime state (next window, pause, suspension). A ``code`` routine of the same
owner that the code no longer declares is retired (never fired, history
kept); declared again, it comes back. Every write carries the code's
declaration stamp: a stamp older than the newest one stored for the owner
changes nothing, so an old beat that (re)starts during a rolling deploy never
undoes what the new code wrote.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, and_, or_, select, update
from sqlalchemy.exc import IntegrityError

from .connections import connections_for
from .models import ROUTINES

table = ROUTINES
c = table.c
CODE = "code"
# The pause reason ``import --disabled`` writes. That pause only waits for the
# switch-over, which a code declaration taking the routine over is: it ends
# it. Any other pause (an operator's, with or without a reason, an automatic
# one) has another reason and stays.
IMPORT_PAUSE_REASON = (
    "imported paused (--disabled): `celery routines resume NAME` once the old scheduler is stopped"
)
# Columns that decide when a routine fires: a change resets its next window.
SCHEDULE_COLUMNS = (
    "cron",
    "interval_seconds",
    "timezone",
    "at",
    "solar",
    "rrule",
    "starts_at",
    "ends_at",
    "jitter_seconds",
    "schedules",
    "exclude",
    "shift",
)


def stamp_key(stamp: str | None) -> tuple[int, float, str]:
    """How declaration stamps order: numbers as numbers, before any text
    (text, such as the default ISO instants, in text order)."""
    if stamp is None:
        return (-1, 0.0, "")
    try:
        return (0, float(stamp), "")
    except ValueError:
        return (1, 0.0, stamp)


@dataclass(frozen=True)
class Revived:
    id: int
    name: str
    retired_at: datetime


@dataclass
class Declared:
    """What writing the declarations did."""

    written: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    revived: list[Revived] = field(default_factory=list)
    # Routines the import had paused, taken over by the code and resumed.
    resumed: list[str] = field(default_factory=list)
    # Set when the stored declarations are newer: nothing was written.
    newer_stamp: str | None = None


class DeclarationQueries:
    def __init__(self, engine: Engine) -> None:
        self.db = connections_for(engine)

    def missing(self, names: Collection[str]) -> list[str]:
        """The names among ``names`` that no stored routine has."""
        if not names:
            return []
        with self.db.read() as conn:
            found = set(conn.execute(select(c.name).where(c.name.in_(list(names)))).scalars())
        return sorted(set(names) - found)

    def write(
        self,
        definitions: Sequence[dict[str, Any]],
        now: datetime,
        *,
        owner: str,
        stamp: str | None,
    ) -> Declared:
        try:
            return self._write(definitions, now, owner, stamp)
        except IntegrityError:
            # Another beat inserted the same names between our read and write.
            return self._write(definitions, now, owner, stamp)

    def _write(
        self, definitions: Sequence[dict[str, Any]], now: datetime, owner: str, stamp: str | None
    ) -> Declared:
        names = [d["name"] for d in definitions]
        outcome = Declared(written=names)
        # Code rows written before owners were stored belong to the first
        # owner that writes its declarations.
        owned = and_(c.source == CODE, or_(c.owner == owner, c.owner.is_(None)))
        with self.db.write() as conn:
            stored = {
                row.name: row
                for row in conn.execute(
                    select(
                        c.id,
                        c.name,
                        c.source,
                        c.owner,
                        c.retired_at,
                        c.declared_version,
                        c.paused,
                        c.paused_reason,
                        *[c[col] for col in SCHEDULE_COLUMNS],
                    )
                    .where(or_(c.name.in_(names), owned) if names else owned)
                    .with_for_update()
                )
            }
            newest = max(
                (r.declared_version for r in stored.values() if _owned(r, owner)),
                key=stamp_key,
                default=None,
            )
            if newest is not None and stamp_key(stamp) < stamp_key(newest):
                return Declared(newer_stamp=newest)
            for definition in definitions:
                values = {
                    **definition,
                    "source": CODE,
                    "owner": owner,
                    "declared_version": stamp,
                    "retired_at": None,
                    "updated_at": now,
                }
                row = stored.get(definition["name"])
                if row is None:
                    conn.execute(table.insert().values(**values, created_at=now))
                    continue
                if row.retired_at is not None:
                    outcome.revived.append(Revived(row.id, row.name, row.retired_at))
                    values.update(next_run_at=None, schedule_fingerprint=None)
                elif any(getattr(row, col) != definition.get(col) for col in SCHEDULE_COLUMNS):
                    values.update(next_run_at=None, schedule_fingerprint=None)
                if row.source != CODE and row.paused and row.paused_reason == IMPORT_PAUSE_REASON:
                    # The code declares it: it runs as the code says, and a
                    # routine declared in code is never paused by default.
                    values.update(paused=False, paused_reason=None, failures_counted_from=now)
                    outcome.resumed.append(row.name)
                values = {"last_error": None, **values}
                conn.execute(update(table).where(c.id == row.id).values(**values))
            gone = sorted(
                r.name
                for r in stored.values()
                if _owned(r, owner) and r.name not in set(names) and r.retired_at is None
            )
            if gone:
                conn.execute(
                    update(table)
                    .where(c.name.in_(gone), owned, c.retired_at.is_(None))
                    .values(
                        retired_at=now,
                        next_run_at=None,
                        schedule_fingerprint=None,
                        declared_version=stamp,
                        updated_at=now,
                    )
                )
            outcome.retired = gone
        return outcome


def _owned(row: Any, owner: str) -> bool:
    return bool(row.source == CODE and row.owner in (owner, None))
