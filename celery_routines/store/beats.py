"""The beats' heartbeats: ``routine_beats``, one row per beat process.

A beat writes its row with one statement (:meth:`BeatQueries.beat`), an upsert
that also counts the claims the beat holds and stamps the database's clock, so
nothing else is read to write it. The panel reads the rows of the last hour
with the database's clock in the same SELECT (:meth:`BeatQueries.recent`):
how long ago each beat ticked is measured on one clock, whatever the panel
host's clock says.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    Insert,
    bindparam,
    delete,
    func,
    literal,
    select,
    type_coerce,
)

from ..clock import utc_now
from .compiled import DriverStatement, naive_utc
from .connections import connections_for
from .dialects import database_clock, is_mysql
from .models import ROUTINE_BEATS, ROUTINES
from .routines import ACTIVE
from .types import UTCDateTime

beats = ROUTINE_BEATS
c = beats.c
r = ROUTINES.c
# A row whose beat has not ticked for this long is deleted by the prune pass.
KEEP_BEATS = timedelta(days=1)
# The panel lists the beats that ticked this recently.
RECENT = timedelta(hours=1)
# Columns the upsert replaces on an existing row (all but the key).
UPDATED = (
    "host",
    "pid",
    "started_at",
    "last_tick_at",
    "beat_clock_at",
    "tick_p50_ms",
    "tick_p99_ms",
    "ticks_measured",
    "claims_held",
    "publish_processes",
    "version",
    "stale_after_seconds",
)


@dataclass(frozen=True)
class BeatPulse:
    """What one heartbeat says about its beat, besides what the database
    measures itself (its clock, the claims held)."""

    beat_id: str
    host: str
    pid: int
    started_at: datetime
    tick_p50_ms: float | None
    tick_p99_ms: float | None
    ticks_measured: int
    publish_processes: int
    version: str
    stale_after_seconds: float


@dataclass(frozen=True)
class BeatRow:
    """A beat's row as the panel shows it, with the database's clock."""

    beat_id: str
    host: str
    pid: int
    started_at: datetime
    last_tick_at: datetime
    tick_p50_ms: float | None
    tick_p99_ms: float | None
    ticks_measured: int
    claims_held: int
    clock_skew_seconds: float
    publish_processes: int
    version: str
    stale_after_seconds: float
    # The database's clock when the rows were read, minus ``last_tick_at``.
    seconds_since_tick: float

    @property
    def stale(self) -> bool:
        """Silent for longer than a few of its own heartbeat gaps."""
        return self.seconds_since_tick > self.stale_after_seconds


class BeatQueries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.table = beats
        self.db = connections_for(engine)
        self._clock = database_clock(engine.dialect)
        # Built at the first heartbeat (workers, the CLI and the panel never
        # write one); on PostgreSQL compiled once to the driver's SQL, as the
        # tick's probe is: it runs on most of an idle beat's ticks.
        self._statement: Insert | None = None
        self._compiled: DriverStatement | None = None

    def _now(self, now: datetime | None) -> ColumnElement[datetime]:
        """``now``, else the database's clock (the process clock on SQLite), as
        a column of a SELECT."""
        if now is None and self._clock is not None:
            return type_coerce(self._clock, UTCDateTime())
        return literal(now or utc_now(), UTCDateTime())

    def _upsert(self) -> Insert:
        """The heartbeat statement, built once; the database's clock and the
        claims count are bound per call on SQLite only (no clock of its own)."""
        clock = bindparam("db_now", type_=UTCDateTime()) if self._clock is None else self._clock
        held = (
            select(func.count())
            .select_from(ROUTINES)
            .where(
                # The due index: held claims are on due routines (a claim is
                # released when its routine moves on), so the count costs
                # what is due, not what is stored.
                ACTIVE,
                r.next_run_at <= clock,
                r.locked_by == bindparam("beat_id"),
                r.locked_until >= clock,
            )
            .scalar_subquery()
        )
        values: dict[str, Any] = {
            name: bindparam(name, type_=c[name].type)
            for name in ("beat_id", *UPDATED)
            if name not in ("last_tick_at", "claims_held")
        }
        values["last_tick_at"] = clock
        values["claims_held"] = held
        # Each dialect's insert is imported only where it runs: a beat loads
        # its own database's SQL constructs, not every one's.
        dialect = self.engine.dialect
        if is_mysql(dialect):
            from sqlalchemy.dialects.mysql import insert as mysql_insert

            statement = mysql_insert(beats).values(values)
            return statement.on_duplicate_key_update(
                {name: statement.inserted[name] for name in UPDATED}
            )
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            pg = pg_insert(beats).values(values)
            return pg.on_conflict_do_update(
                index_elements=[c.beat_id], set_={name: pg.excluded[name] for name in UPDATED}
            )
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        lite = sqlite_insert(beats).values(values)
        return lite.on_conflict_do_update(
            index_elements=[c.beat_id], set_={name: lite.excluded[name] for name in UPDATED}
        )

    def beat(self, pulse: BeatPulse, beat_clock: datetime) -> None:
        """Write ``pulse`` as the beat's row, in one statement: ``beat_clock``
        is the beat's clock read just before, the database stamps its own."""
        params: dict[str, Any] = {
            "beat_id": pulse.beat_id,
            "host": pulse.host,
            "pid": pulse.pid,
            "started_at": pulse.started_at,
            "beat_clock_at": beat_clock,
            "tick_p50_ms": pulse.tick_p50_ms,
            "tick_p99_ms": pulse.tick_p99_ms,
            "ticks_measured": pulse.ticks_measured,
            "publish_processes": pulse.publish_processes,
            "version": pulse.version,
            "stale_after_seconds": pulse.stale_after_seconds,
        }
        if self._clock is None:
            params["db_now"] = utc_now()
        if self._statement is None:
            self._statement = self._upsert()
            if self.engine.dialect.name == "postgresql":
                self._compiled = DriverStatement.compile(self._statement, self.engine.dialect)
        with self.db.fast_write() as conn:
            if self._compiled is not None:
                for name in ("started_at", "beat_clock_at"):
                    params[name] = naive_utc(params[name])
                self._compiled.execute(conn, params)
            else:
                conn.execute(self._statement, params)

    def recent(self, now: datetime | None = None, within: timedelta = RECENT) -> list[BeatRow]:
        """The beats that ticked within ``within`` of ``now`` (the database's
        clock when not given), the most recently started first."""
        # The cut-off needs no precision: an hour on the process clock is
        # the same hour, give or take the skew the rows report.
        cutoff = (now or utc_now()) - within
        query = (
            select(*beats.columns, self._now(now).label("db_now"))
            .where(c.last_tick_at >= cutoff)
            .order_by(c.host, c.started_at.desc(), c.beat_id)
        )
        with self.db.read() as conn:
            rows = conn.execute(query).all()
        return [_row(row) for row in rows]

    def forget(self, beat_id: str) -> None:
        """Delete one beat's row (it stopped cleanly)."""
        with self.db.fast_write() as conn:
            conn.execute(delete(beats).where(c.beat_id == beat_id))

    def prune(self, cutoff: datetime) -> int:
        """Delete the rows of beats that have not ticked since ``cutoff``."""
        with self.db.fast_write() as conn:
            return conn.execute(delete(beats).where(c.last_tick_at < cutoff)).rowcount


def _row(row: Any) -> BeatRow:
    db_now: datetime = row.db_now
    return BeatRow(
        beat_id=row.beat_id,
        host=row.host,
        pid=row.pid,
        started_at=row.started_at,
        last_tick_at=row.last_tick_at,
        tick_p50_ms=row.tick_p50_ms,
        tick_p99_ms=row.tick_p99_ms,
        ticks_measured=row.ticks_measured,
        claims_held=row.claims_held,
        clock_skew_seconds=(row.beat_clock_at - row.last_tick_at).total_seconds(),
        publish_processes=row.publish_processes,
        version=row.version,
        stale_after_seconds=row.stale_after_seconds,
        seconds_since_tick=max((db_now - row.last_tick_at).total_seconds(), 0.0),
    )
