"""The store: the only place that speaks SQL."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime

from sqlalchemy import Engine, select

from . import migrate
from .admin_queries import AdminQueries
from .connections import Connections, connections_for
from .engine import make_engine
from .records import NewRun, RoutineRecord, RunRecord
from .routines import Advance, RoutineQueries, _aware
from .runs import RunQueries
from .spend_queries import SpendQueries

__all__ = ["Advance", "NewRun", "RoutineRecord", "RunRecord", "Store"]


class Store:
    """The engine plus one query object per table."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.connections: Connections = connections_for(engine)
        self.routines = RoutineQueries(engine)
        self.runs = RunQueries(engine)
        self.admin = AdminQueries(engine)
        self.spend = SpendQueries(engine)

    @classmethod
    def from_url(cls, url: str) -> Store:
        return cls(make_engine(url))

    def migrate(self) -> None:
        migrate.upgrade(self.engine)

    def wakeup_instants(
        self, now: datetime
    ) -> tuple[datetime | None, datetime | None, datetime | None]:
        """For the tick's sleep, in one round trip: the next routine instant
        (window or claim expiry), the next ``retry_at``, the next run deadline."""
        columns = [*self.routines.wakeup_columns(now), *self.runs.instant_columns()]
        with self.connections.fast_read() as conn:
            row = conn.execute(select(*columns)).one()
        routine = [_aware(instant) for instant in (row.window, row.expiry) if instant is not None]
        return (
            min(routine) if routine else None,
            _aware(row.retry_at) if row.retry_at is not None else None,
            _aware(row.deadline) if row.deadline is not None else None,
        )

    def session(self) -> AbstractContextManager[None]:
        """One connection for this thread's queries until the block ends."""
        return self.connections.session()

    def transaction(self) -> AbstractContextManager[None]:
        """This thread's queries in one transaction, committed at the block's end."""
        return self.connections.transaction()

    def dispose(self) -> None:
        self.engine.dispose()
