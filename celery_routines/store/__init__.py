"""The store: the only place that speaks SQL."""

from __future__ import annotations

from sqlalchemy import Engine

from . import migrate
from .admin_queries import AdminQueries
from .engine import make_engine
from .records import NewRun, RoutineRecord, RunRecord
from .routines import Advance, RoutineQueries
from .runs import RunQueries
from .spend_queries import SpendQueries

__all__ = ["Advance", "NewRun", "RoutineRecord", "RunRecord", "Store"]


class Store:
    """The engine plus one query object per table."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.routines = RoutineQueries(engine)
        self.runs = RunQueries(engine)
        self.admin = AdminQueries(engine)
        self.spend = SpendQueries(engine)

    @classmethod
    def from_url(cls, url: str) -> Store:
        return cls(make_engine(url))

    def migrate(self) -> None:
        migrate.upgrade(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()
