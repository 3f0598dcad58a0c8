"""The store: the only place that speaks SQL."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, bindparam, func, select

from ..clock import as_utc, utc_now
from . import migrate
from .admin_queries import AdminQueries
from .bookkeeping import BookkeepingQueries, Published
from .connections import Connections, connections_for
from .engine import make_engine
from .records import NewRun, RoutineRecord, RunRecord
from .routines import Advance, RoutineQueries, _aware
from .runs import RunQueries
from .spend_queries import SpendQueries

__all__ = ["Advance", "NewRun", "Probe", "Published", "RoutineRecord", "RunRecord", "Store"]


@dataclass(frozen=True)
class Probe:
    """The state of the schedule as one tick sees it before acting."""

    # The next routine instant: a window, or the expiry of a claim on a due routine.
    routine: datetime | None
    # The oldest window of a routine nobody holds (due if not after now).
    window: datetime | None
    # The oldest ``retry_at`` of a retry, and the oldest deadline of an open run.
    retry_at: datetime | None
    deadline: datetime | None
    # Routines waiting for their first window.
    unscheduled: bool
    # Due routines held by this beat itself (``overlap="queue"`` deferrals).
    held_due: bool


class Store:
    """The engine plus one query object per table."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.connections: Connections = connections_for(engine)
        self.routines = RoutineQueries(engine)
        self.runs = RunQueries(engine)
        self.admin = AdminQueries(engine)
        self.spend = SpendQueries(engine)
        self.bookkeeping = BookkeepingQueries(engine)
        # Built once: constructing it cost more than running it.
        self._probe = select(
            *self.routines.probe_columns(bindparam("now"), bindparam("holder"), bindparam("arb")),
            *self.runs.instant_columns(),
        )

    @classmethod
    def from_url(cls, url: str, *, ping_after_idle: float | None = None) -> Store:
        return cls(make_engine(url, ping_after_idle=ping_after_idle))

    def migrate(self) -> None:
        migrate.upgrade(self.engine)

    def probe(self, now: datetime, holder: str, arbitration: datetime | None = None) -> Probe:
        """Everything a tick needs to know before it does anything, and when
        to wake next, in one round trip (each column reads the first entry of
        an index). Claims and run deadlines are compared on ``arbitration``
        (the database's clock; ``now`` when not given); every instant returned
        is on the beat's clock, ``now``'s."""
        at = now if arbitration is None else arbitration
        shift = at - now
        with self.connections.fast_read() as conn:
            row = conn.execute(self._probe, {"now": now, "holder": holder, "arb": at}).one()
        expiry = _aware(row.expiry) - shift if row.expiry is not None else None
        window = _aware(row.window) if row.window is not None else None
        routine = [instant for instant in (window, expiry) if instant is not None]
        return Probe(
            routine=min(routine) if routine else None,
            window=window,
            retry_at=_aware(row.retry_at) if row.retry_at is not None else None,
            deadline=_aware(row.deadline) - shift if row.deadline is not None else None,
            unscheduled=bool(row.unscheduled),
            held_due=bool(row.held_due),
        )

    def db_now(self) -> datetime:
        """The database's clock: what claims and run deadlines are written
        and compared on. SQLite has none of its own: the process clock."""
        if self.engine.dialect.name == "sqlite":
            return utc_now()
        with self.connections.fast_read() as conn:
            value = conn.execute(select(func.now())).scalar_one()
        return as_utc(value)

    def session(self) -> AbstractContextManager[None]:
        """One connection for this thread's queries until the block ends."""
        return self.connections.session()

    def transaction(self) -> AbstractContextManager[None]:
        """This thread's queries in one transaction, committed at the block's end."""
        return self.connections.transaction()

    def dispose(self) -> None:
        self.engine.dispose()
