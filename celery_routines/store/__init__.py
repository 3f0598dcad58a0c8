"""The store: the only place that speaks SQL."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Engine, Select, bindparam, func, select, type_coerce

from ..clock import as_utc, utc_now
from . import migrate
from .admin_queries import AdminQueries
from .beats import BeatQueries
from .bookkeeping import BookkeepingQueries, Published
from .changes import ChangeQueries
from .compiled import DriverStatement, naive_utc
from .connections import Connections, connections_for
from .dialects import database_clock
from .engine import make_engine
from .failure_streaks import FailureStreakQueries
from .panel_queries import PanelQueries
from .prune import PruneQueries
from .records import NewRun, RoutineRecord, RunRecord
from .refresh import RefreshQueries
from .routines import Advance, RoutineQueries, _aware
from .run_metrics import RunMetricsQueries
from .run_outcomes import RunOutcomeQueries
from .run_retries import RunRetryQueries
from .runs import RunQueries
from .spend_queries import SpendQueries
from .types import UTCDateTime

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
    # The database's clock when the probe ran, when asked for and it has one.
    clock: datetime | None = None
    # Routines changed outside beat since their next window was computed
    # (asked for every routines_refresh_seconds only).
    changed: bool = False


class StoreSettings(Protocol):
    """What a store is built from (``celery_routines.config.Settings``)."""

    @property
    def database_url(self) -> str: ...

    @property
    def prepared_statements(self) -> str: ...


class Store:
    """The engine plus one query object per table."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.connections: Connections = connections_for(engine)
        self.routines = RoutineQueries(engine)
        self.runs = RunQueries(engine)
        # The retry hand-over's and the worker's queries on routine_runs.
        self.retries = RunRetryQueries(engine)
        self.outcomes = RunOutcomeQueries(engine)
        self.admin = AdminQueries(engine)
        self.spend = SpendQueries(engine)
        self.bookkeeping = BookkeepingQueries(engine)
        self.run_metrics = RunMetricsQueries(engine)
        self.panel = PanelQueries(engine)
        self.changes = ChangeQueries(engine)
        self.prune = PruneQueries(engine)
        self.streaks = FailureStreakQueries(engine)
        # The beats' heartbeats (issue 33): written by beat, read by the panel.
        self.beats = BeatQueries(engine)
        # Built once: constructing it cost more than running it. Each has a
        # refresh variant that also says whether rows changed outside beat
        # (read every routines_refresh_seconds: it scans the routines).
        self.refresh = RefreshQueries(engine)
        self._probe, self._probe_refresh = (self._probe_select(None, r) for r in (False, True))
        # The same probe arbitrating on the database's clock, which it also
        # returns: the tick learns the clock offset without a round trip.
        clock = database_clock(engine.dialect)
        # (None on SQLite: no clock of its own.) Plain, then with refresh.
        self._probes_on_clock: tuple[Select[Any], Select[Any]] | None = None
        if clock is not None:
            self._probes_on_clock = (
                self._probe_select(clock, False),
                self._probe_select(clock, True),
            )
        # The probe runs every tick, idle or not: on PostgreSQL its SQL is
        # compiled once (SQLAlchemy's preparation cost as much as running it).
        postgres = engine.dialect.name == "postgresql"
        self._compiled_probes: dict[int, DriverStatement] | None = {} if postgres else None

    def _compiled_probe(self, statement: Any) -> DriverStatement:
        assert self._compiled_probes is not None
        compiled = self._compiled_probes.get(id(statement))
        if compiled is None:
            compiled = DriverStatement.compile(statement, self.engine.dialect)
            self._compiled_probes[id(statement)] = compiled
        return compiled

    def _probe_select(self, clock: ColumnElement[Any] | None, refresh: bool) -> Select[Any]:
        arbitration: ColumnElement[Any] = bindparam("arb") if clock is None else clock
        columns = [
            *self.routines.probe_columns(bindparam("now"), bindparam("holder"), arbitration),
            *self.runs.instant_columns(),
        ]
        if clock is not None:
            columns.append(type_coerce(clock, UTCDateTime()).label("clock"))
        if refresh:
            columns.append(self.refresh.changed_column())
        return select(*columns)

    @classmethod
    def from_settings(
        cls, settings: StoreSettings, *, ping_after_idle: float | None = None
    ) -> Store:
        """The store ``settings`` name (``routines_database_url``, and how its
        PostgreSQL connections prepare statements)."""
        return cls.from_url(
            settings.database_url,
            ping_after_idle=ping_after_idle,
            prepared_statements=settings.prepared_statements,
        )

    @classmethod
    def from_url(
        cls, url: str, *, ping_after_idle: float | None = None, prepared_statements: str = "auto"
    ) -> Store:
        return cls(
            make_engine(
                url, ping_after_idle=ping_after_idle, prepared_statements=prepared_statements
            )
        )

    def migrate(self) -> None:
        migrate.upgrade(self.engine)

    def probe(
        self,
        now: datetime,
        holder: str,
        arbitration: datetime | None = None,
        *,
        on_database_clock: bool = False,
        refresh: bool = False,
    ) -> Probe:
        """Everything a tick needs to know before it does anything, and when
        to wake next, in one round trip (each column reads the first entry of
        an index). Claims and run deadlines are compared on ``arbitration``
        (``now`` when not given), or, ``on_database_clock``, on the database's
        clock (:meth:`db_now`, read in the same statement), returned as
        ``Probe.clock``; ``refresh`` also asks whether routines were changed
        outside beat (``Probe.changed``).
        every instant returned is on the beat's clock, ``now``'s."""
        at = now if arbitration is None else arbitration
        statement, clock = self._probe_refresh if refresh else self._probe, None
        if on_database_clock:
            if self._probes_on_clock is None:
                at = clock = self.db_now()  # no statement: the process clock
            else:
                plain, with_refresh = self._probes_on_clock
                statement = with_refresh if refresh else plain
        with self.connections.fast_read() as conn:
            if self._compiled_probes is not None:
                # PostgreSQL: the SQL compiled once, the values as the driver takes them.
                params = {"now": naive_utc(now), "holder": holder, "arb": naive_utc(at)}
                row = self._compiled_probe(statement).execute(conn, params).one()
            else:
                row = conn.execute(statement, {"now": now, "holder": holder, "arb": at}).one()
        if on_database_clock and self._probes_on_clock is not None:
            at = clock = _aware(row.clock)
        shift = at - now
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
            clock=clock,
            changed=bool(row.changed) if refresh else False,
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
