"""Every query on the ``routines`` table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Engine,
    Integer,
    Select,
    and_,
    any_,
    bindparam,
    func,
    not_,
    or_,
    select,
    text,
    update,
)

import celery_routines.store.mysql as mysql_json

from .compiled import DriverStatement, naive_utc
from .connections import connections_for
from .declarations import DeclarationQueries, Declared
from .dialects import is_mysql
from .fingerprint import current_fingerprint, record_columns
from .models import ROUTINES
from .pg_arrays import array_param, int_array
from .records import ROUTINE_RECORD_FIELDS, RoutineRecord
from .types import UTCDateTime

table = ROUTINES
c = table.c

# Spelled exactly like the partial indexes' predicate so both SQLite and
# PostgreSQL use them.
ACTIVE = text("routines.enabled AND NOT routines.paused")
RECORD_COLUMNS = record_columns()
# Where a driver's row of RECORD_COLUMNS holds a naive UTC instant.
INSTANT_POSITIONS = tuple(
    i for i, column in enumerate(RECORD_COLUMNS) if isinstance(column.type, UTCDateTime)
)
_new_object = object.__new__


def _record(row: Any) -> RoutineRecord:
    """A row of ``RECORD_COLUMNS`` (the record's fields, in order)."""
    return RoutineRecord(*row)


def _record_from_driver(row: Any) -> RoutineRecord:
    """A driver's row of ``RECORD_COLUMNS``: its naive UTC instants made aware.

    Fields filled in directly: a frozen dataclass's ``__init__`` sets its 36
    fields one ``object.__setattr__`` at a time, three times the rest's cost.
    A row without every field goes through the constructor and its defaults."""
    values = list(row)
    for i in INSTANT_POSITIONS:
        instant = values[i]
        if instant is not None:
            values[i] = instant.replace(tzinfo=UTC)
    if len(values) != len(ROUTINE_RECORD_FIELDS):
        return RoutineRecord(*values)
    record = _new_object(RoutineRecord)
    record.__dict__.update(zip(ROUTINE_RECORD_FIELDS, values, strict=True))
    return record


def _aware(instant: datetime) -> datetime:
    """A bare MIN() in a subquery may come back without the column's type."""
    if isinstance(instant, str):
        instant = datetime.fromisoformat(instant)
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


def _claimable(now: Any, holder: Any = None, arbitration: Any = None) -> ColumnElement[bool]:
    """Due (``next_run_at <= now``, beat's clock) and free to claim (no claim,
    or one expired by ``arbitration``, the database's clock, else ``now``)."""
    at = now if arbitration is None else arbitration
    free = or_(c.locked_until.is_(None), c.locked_until < at)
    if holder is not None:
        # A beat may always take back what it holds itself: a routine it
        # deferred (overlap="queue") is rechecked on its very next tick.
        free = or_(free, c.locked_by == holder)
    return and_(ACTIVE, c.next_run_at <= now, free)


@dataclass(frozen=True)
class Advance:
    routine_id: int
    next_run_at: datetime


class RoutineQueries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.db = connections_for(engine)
        self._postgres = engine.dialect.name == "postgresql"
        self._mysql = is_mysql(engine)
        self._claim = self._claim_statement()
        # PostgreSQL: the claim compiled once and run through the driver; a
        # burst's tick decodes a thousand claimed rows of 40 columns, and
        # SQLAlchemy's per-row processing cost more than building the records.
        self._claim_driver = (
            DriverStatement.compile(self._claim, engine.dialect) if self._postgres else None
        )
        # MySQL has no UPDATE ... RETURNING (MariaDB neither) and refuses a
        # LIMIT inside IN (...): it claims in two statements in a transaction,
        # a locking select that skips other beats' locked rows, then an
        # UPDATE of exactly the rows it locked.
        self._claim_lock = (
            self.due_select(
                bindparam("now"), bindparam("limit"), bindparam("holder"), bindparam("arb")
            )
            .with_only_columns(*RECORD_COLUMNS)
            .with_for_update(skip_locked=True)
        )

    # -- definitions ---------------------------------------------------------

    def upsert_definitions(
        self,
        definitions: Sequence[dict[str, Any]],
        now: datetime,
        *,
        owner: str = "default",
        stamp: str | None = None,
    ) -> Declared:
        """Write routines declared in code, retire the owner's code routines
        no longer declared (see :mod:`celery_routines.store.declarations`)."""
        return DeclarationQueries(self.engine).write(definitions, now, owner=owner, stamp=stamp)

    # -- the tick ------------------------------------------------------------

    def unscheduled(self, limit: int) -> list[RoutineRecord]:
        """Enabled routines that have no next window yet (new or SQL-inserted)."""
        query = (
            select(*RECORD_COLUMNS)
            .where(c.next_run_at.is_(None), c.enabled, c.retired_at.is_(None))
            .order_by(c.id)
            .limit(limit)
        )
        with self.db.fast_read() as conn:
            return [_record(row) for row in conn.execute(query)]

    def adopt(self, first_windows: Iterable[Advance], now: datetime) -> int:
        """Give unscheduled routines their first window; a row another beat
        adopted meanwhile is left as it is."""
        adopted = list(first_windows)
        if not adopted:
            return 0
        params = [{"rid": a.routine_id, "nra": a.next_run_at, "now": now} for a in adopted]
        if self._mysql:
            rows = mysql_json.windows((a.routine_id, a.next_run_at) for a in adopted)
            with self.db.fast_write() as conn:
                result = conn.execute(
                    mysql_json.ADOPT, {"rows": rows, "now": mysql_json.naive(now)}
                )
                return result.rowcount
        stmt = (
            update(table)
            .where(c.id == bindparam("rid"), c.next_run_at.is_(None))
            .values(
                next_run_at=bindparam("nra"),
                last_error=None,
                updated_at=bindparam("now"),
                schedule_fingerprint=current_fingerprint(),
            )
        )
        with self.db.fast_write() as conn:
            return conn.execute(stmt, params).rowcount

    def claim_due(
        self,
        now: datetime,
        holder: str,
        ttl_seconds: float,
        limit: int,
        arbitration: datetime | None = None,
        excluding: Sequence[int] = (),
    ) -> list[RoutineRecord]:
        """Claim up to ``limit`` due routines, oldest first, for ``ttl_seconds``.

        One conditional UPDATE: a row claimed by a live beat is not due for
        another until its claim expires, and on PostgreSQL concurrent beats
        skip each other's locked rows instead of queueing behind them.
        ``excluding`` (PostgreSQL): routines held here not to take back (tick/ahead.py).
        """
        at = now if arbitration is None else arbitration
        params = {
            "now": now,
            "arb": at,
            "holder": holder,
            "until": at + timedelta(seconds=ttl_seconds),
            "limit": limit,
        }
        if self._claim_driver is not None:
            rows = self._claim_due_driver({**params, "excluding": int_array(excluding)})
        elif excluding:
            raise ValueError("claiming around routines still being sent is PostgreSQL's only")
        elif self._mysql:
            rows = self._claim_due_mysql(params)
        else:
            with self.db.fast_write() as conn:
                rows = [_record(row) for row in conn.execute(self._claim, params)]
        rows.sort(key=lambda r: (r.next_run_at, r.id))
        return rows

    def _claim_due_driver(self, params: dict[str, Any]) -> list[RoutineRecord]:
        """The claim's own SQL, its instants bound and read as naive UTC, as
        the column type would (see ``store/compiled.py``)."""
        assert self._claim_driver is not None
        bound = {
            **params,
            "now": naive_utc(params["now"]),
            "arb": naive_utc(params["arb"]),
            "until": naive_utc(params["until"]),
        }
        with self.db.fast_write() as conn:
            return [_record_from_driver(row) for row in self._claim_driver.execute(conn, bound)]

    def _claim_due_mysql(self, params: dict[str, Any]) -> list[RoutineRecord]:
        with self.db.write() as conn:
            locked = [_record(row) for row in conn.execute(self._claim_lock, params)]
            if not locked:
                return []
            # Every locked row is claimable (the select's own condition) and
            # stays so until this transaction ends: no other beat can change it.
            holder, until = params["holder"], params["until"]
            ids = mysql_json.ids([r.id for r in locked])
            conn.execute(
                mysql_json.CLAIM,
                {"ids": ids, "holder": holder, "until": mysql_json.naive(until)},
            )
        return [replace(r, locked_by=holder, locked_until=until) for r in locked]

    def _claim_statement(self) -> Any:
        """:meth:`claim_due`'s statement, built once (parameters: now, holder,
        until, limit): building it afresh cost more than running it."""
        now, holder, arb = cast(Any, [bindparam(key) for key in ("now", "holder", "arb")])
        due = self.due_select(now, bindparam("limit"), holder, arb)
        if self._postgres:
            # Never the routines this beat is still sending (empty: none).
            due = due.where(not_(c.id == any_(array_param("excluding", Integer))))
            # A materialised CTE runs the locking select exactly once; as a
            # plain IN subquery PostgreSQL may re-run it per outer row, and a
            # re-run that skips the rows it just locked claims past the LIMIT.
            locked = due.with_for_update(skip_locked=True).cte("due").prefix_with("MATERIALIZED")
            due_ids = select(locked.c.id).scalar_subquery()
        else:
            due_ids = due.scalar_subquery()
        return (
            update(table)
            .where(c.id.in_(due_ids), _claimable(now, holder, arb))
            .values(locked_by=holder, locked_until=bindparam("until"))
            .returning(*RECORD_COLUMNS)
        )

    def due_select(
        self, now: Any, limit: Any, holder: Any = None, arbitration: Any = None
    ) -> Select[Any]:
        """The due-query: a range scan of the due index from the oldest row."""
        due = _claimable(now, holder, arbitration)
        return select(c.id).where(due).order_by(c.next_run_at).limit(limit)

    def advance(self, advances: Sequence[Advance], holder: str, now: datetime) -> int:
        """Move claimed routines to their next window and release the claims.

        Conditional on still holding the claim: a beat whose claim expired
        must not overwrite the progress of the beat that took over.
        """
        if not advances:
            return 0
        if self._mysql:
            # One statement, not one UPDATE per routine (see store/mysql.py).
            rows = mysql_json.windows((a.routine_id, a.next_run_at) for a in advances)
            with self.db.fast_write() as conn:
                values = {"rows": rows, "holder": holder, "now": mysql_json.naive(now)}
                return conn.execute(mysql_json.ADVANCE, values).rowcount
        stmt = (
            update(table)
            .where(c.id == bindparam("rid"), c.locked_by == holder)
            .values(
                next_run_at=bindparam("nra"),
                locked_by=None,
                locked_until=None,
                last_error=None,
                updated_at=bindparam("now"),
            )
        )
        params = [{"rid": a.routine_id, "nra": a.next_run_at, "now": now} for a in advances]
        with self.db.fast_write() as conn:
            return conn.execute(stmt, params).rowcount

    def renew_claims(self, routine_ids: Sequence[int], holder: str, until: datetime) -> set[int]:
        """Extend the claims ``holder`` still has on these routines to
        ``until``; the ids it still holds (a routine another beat claimed
        meanwhile is not among them)."""
        if not routine_ids:
            return set()
        if self._mysql:
            return self._renew_claims_mysql(routine_ids, holder, until)
        # Rows are locked in id order, as the advance writes them: two beats
        # renewing overlapping sets (one took the other's expired claims)
        # then wait for each other instead of deadlocking.
        held = (
            select(c.id)
            .where(c.id.in_(list(routine_ids)), c.locked_by == holder)
            .order_by(c.id)
            .with_for_update()
        )
        if self._postgres:
            locked = held.cte("held").prefix_with("MATERIALIZED")
            held_ids = select(locked.c.id).scalar_subquery()
        else:
            held_ids = held.scalar_subquery()
        stmt = (
            update(table)
            .where(c.id.in_(held_ids), c.locked_by == holder)
            .values(locked_until=until)
            .returning(c.id)
        )
        with self.db.fast_write() as conn:
            return {row.id for row in conn.execute(stmt)}

    def release_claims(self, holder: str) -> int:
        """Give up every claim ``holder`` has (a beat stopping cleanly): the
        other beats may take those routines at once, not after the TTL."""
        stmt = update(table).where(c.locked_by == holder).values(locked_by=None, locked_until=None)
        with self.db.fast_write() as conn:
            return conn.execute(stmt).rowcount

    def _renew_claims_mysql(
        self, routine_ids: Sequence[int], holder: str, until: datetime
    ) -> set[int]:
        # The rows still held, locked in id order (as above), then renewed:
        # while locked, nobody else can take them between the two statements.
        held = (
            select(c.id)
            .where(c.id.in_(list(routine_ids)), c.locked_by == holder)
            .order_by(c.id)
            .with_for_update()
        )
        with self.db.write() as conn:
            ids = [row.id for row in conn.execute(held)]
            if ids:
                conn.execute(update(table).where(c.id.in_(ids)).values(locked_until=until))
        return set(ids)

    def defer(self, routine_ids: Sequence[int], holder: str, until: datetime) -> None:
        """Keep due routines claimed until ``until`` without advancing them
        (``overlap="queue"``): other beats leave them alone, this beat's sleep
        ends at ``until`` instead of spinning on a due row, and this beat
        rechecks them on any earlier tick (see ``_claimable``)."""
        if not routine_ids:
            return
        stmt = (
            update(table)
            .where(c.id.in_(list(routine_ids)), c.locked_by == holder)
            .values(locked_until=until)
        )
        with self.db.write() as conn:
            conn.execute(stmt)

    def mark_invalid(
        self, routine_id: int, error: str, retry_at: datetime, holder: str | None, now: datetime
    ) -> None:
        """Record why a routine cannot be scheduled and look again at ``retry_at``."""
        stmt = (
            update(table)
            .where(c.id == routine_id)
            .values(
                last_error=error,
                next_run_at=retry_at,
                locked_by=None,
                locked_until=None,
                updated_at=now,
            )
        )
        if holder is not None:
            stmt = stmt.where(c.locked_by == holder)
        else:
            stmt = stmt.where(c.next_run_at.is_(None))
        with self.db.write() as conn:
            conn.execute(stmt)

    def probe_columns(self, now: Any, holder: Any, arbitration: Any) -> list[Any]:
        """:meth:`wakeup_columns` plus two flags a tick reads before doing
        anything: routines waiting for adoption, and due routines this beat
        holds itself (``overlap="queue"`` deferrals it rechecks every tick)."""
        unscheduled = (
            select(c.id).where(c.next_run_at.is_(None), c.enabled, c.retired_at.is_(None)).exists()
        )
        held_due = select(c.id).where(ACTIVE, c.next_run_at <= now, c.locked_by == holder).exists()
        return [
            *self.wakeup_columns(now, arbitration),
            unscheduled.label("unscheduled"),
            held_due.label("held_due"),
        ]

    def wakeup_columns(self, now: Any, arbitration: Any) -> list[Any]:
        """The instants at which this beat may have something to do with a
        routine, as scalar subqueries (the tick reads them in one round trip
        with the runs' own): the oldest window of a routine nobody holds (in
        the past if one fell due while the tick ran), and the expiry of another
        beat's claim on a due routine (so a survivor takes over within the
        lock TTL; on the database's clock, ``arbitration``)."""
        unheld = or_(c.locked_until.is_(None), c.locked_until < arbitration)
        if self._mysql:
            # MySQL reads MIN() under conditions on other columns by scanning
            # every row; the same minimum as the first entry of the due index
            # that passes them is a scan that stops there. (NULL sorts first
            # in MySQL: unscheduled routines are not windows.)
            earliest_window = (
                select(c.next_run_at)
                .where(ACTIVE, unheld, c.next_run_at.is_not(None))
                .order_by(c.next_run_at)
                .limit(1)
            )
        else:
            earliest_window = select(func.min(c.next_run_at)).where(ACTIVE, unheld)
        claim_expiry = select(func.min(c.locked_until)).where(
            ACTIVE, c.next_run_at <= now, c.locked_until >= arbitration
        )
        return [
            earliest_window.scalar_subquery().label("window"),
            claim_expiry.scalar_subquery().label("expiry"),
        ]

    # -- lookups -------------------------------------------------------------

    def by_name(self, name: str) -> RoutineRecord | None:
        with self.db.read() as conn:
            row = conn.execute(select(*RECORD_COLUMNS).where(c.name == name)).first()
        return _record(row) if row else None

    def by_id(self, routine_id: int) -> RoutineRecord | None:
        with self.db.read() as conn:
            row = conn.execute(select(*RECORD_COLUMNS).where(c.id == routine_id)).first()
        return _record(row) if row else None

    def all(self) -> list[RoutineRecord]:
        with self.db.read() as conn:
            return [_record(row) for row in conn.execute(select(*RECORD_COLUMNS).order_by(c.name))]
