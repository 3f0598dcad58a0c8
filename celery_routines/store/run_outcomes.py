"""The worker's queries on ``routine_runs``: claim a run before its body,
count a refused duplicate delivery, record the outcome, requeue a Celery
retry. Each is one conditional UPDATE, so a run changes hands once.

A run costs its worker two statements when its routine has no ceiling: the
claim (which also starts the run and stamps its deadline on the database's
own clock, so no separate read of that clock) and the outcome (which also
reads whether the routine has a ceiling to check, on PostgreSQL and SQLite).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Engine,
    Update,
    bindparam,
    case,
    func,
    literal,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.sql.dml import ReturningUpdate

from ..clock import utc_now
from .compiled import DriverStatement, naive_utc
from .connections import Connections, connections_for
from .dialects import is_mysql
from .models import ROUTINE_RUNS, ROUTINES
from .types import UTCDateTime

table = ROUTINE_RUNS
c = table.c


def deadline_no_earlier_than(value: ColumnElement[datetime]) -> ColumnElement[datetime]:
    """``deadline_at`` set to ``value`` unless it is already later: a lost
    deadline is pushed on, never back (a heartbeat; a run marked sent)."""
    return case((c.deadline_at > value, c.deadline_at), else_=value)


routines = ROUTINES
STARTABLE_STATES = ("pending", "sent")


@dataclass(frozen=True)
class Finished:
    """What :meth:`RunOutcomeQueries.succeed` did."""

    # The run was ``running`` (or a lost run awaiting its retry) and now has its outcome.
    done: bool
    # Its routine may have a ceiling to check after the run: it has one, or
    # (MySQL, no RETURNING) the statement could not tell.
    check_ceiling: bool


class RunOutcomeQueries:
    """The worker's queries on ``routine_runs`` (``Store.outcomes``)."""

    def __init__(self, engine: Engine) -> None:
        self.db: Connections = connections_for(engine)
        self._postgres = engine.dialect.name == "postgresql"

    def claim_start(
        self,
        run_id: str,
        worker: str,
        now: datetime,
        *,
        deadline_at: datetime | None = None,
        lost_after: float | None = None,
        celery_retries: int = 0,
        released: Sequence[tuple[str, datetime]] | None = None,
        on: Connection | None = None,
    ) -> bool:
        """``pending``/``sent`` -> ``running``; False means someone else has it.

        A delivery of Celery's own ``self.retry()`` carries a higher
        ``request.retries`` than the one holding the run, so it may take over
        a ``running`` row; a duplicate of the same delivery may not.

        The run's deadline: ``deadline_at``, or ``lost_after`` seconds after
        the database's clock, computed by the same UPDATE (claims and run
        deadlines are compared on that clock; see :meth:`Store.db_now`).

        ``released``: the ``(worker, started_at)`` of earlier claims of this
        delivery whose answer never came back (its connection was cut, or the
        delivery was handed back to the broker before its body ran): a
        ``running`` row one of them may have left is taken over, since that
        body never started. Without it, such a row refuses the claim.

        ``on``: an autocommit connection to run it on (the worker's kept one)
        instead of one checked out for it.
        """
        params: dict[str, Any] = {
            "run_id": run_id,
            "now": now,
            "by_worker": worker,
            "retries": celery_retries,
        }
        on_db_clock = lost_after is not None and deadline_at is None
        if released:
            # The rare path (after an outage): built for the call, not compiled.
            new_deadline = (
                deadline_at if deadline_at is not None else self.db_clock_plus(lost_after or 0)
            )
            if isinstance(new_deadline, datetime):
                new_deadline = literal(new_deadline, UTCDateTime())
            stmt = self._claim_start_statement(new_deadline, released=len(released))
            for n, (by, at) in enumerate(released):
                params[f"released_worker_{n}"], params[f"released_at_{n}"] = by, at
            with self._one_statement(on) as conn:
                return conn.execute(stmt, params).rowcount == 1
        if on_db_clock and self._postgres:
            params["lost_after"] = float(lost_after)  # type: ignore[arg-type]
            params["now"] = naive_utc(now)
            with self._one_statement(on) as conn:
                return self._claim_start_compiled.execute(conn, params).rowcount == 1
        if on_db_clock and is_mysql(self.db.engine):
            stmt = self._claim_start_statement(self.db_clock_plus(lost_after))
        else:
            stmt = self._claim_start_with_deadline
            if deadline_at is None and lost_after is not None:
                deadline_at = self.db_clock_plus(lost_after)  # SQLite: the process clock
            params["new_deadline"] = deadline_at
        # One atomic statement: autocommit, no BEGIN/COMMIT round trips.
        with self._one_statement(on) as conn:
            return conn.execute(stmt, params).rowcount == 1

    def _one_statement(
        self, on: Connection | None, transaction: bool = False
    ) -> AbstractContextManager[Connection]:
        """``on`` when given, else a connection of the store's: autocommitted
        for one statement, or in a ``transaction`` (MySQL's outcome)."""
        if on is not None:
            return nullcontext(on)
        return self.db.write() if transaction else self.db.fast_write()

    # Built once: building a statement cost the worker more than running it.
    @cached_property
    def _claim_start_compiled(self) -> DriverStatement:
        statement = self._claim_start_statement(self.db_clock_plus(bindparam("lost_after")))
        return DriverStatement.compile(statement, self.db.engine.dialect)

    @cached_property
    def _claim_start_with_deadline(self) -> Update:
        return self._claim_start_statement(bindparam("new_deadline", type_=UTCDateTime()))

    def _claim_start_statement(
        self, deadline: ColumnElement[datetime] | datetime, *, released: int = 0
    ) -> Update:
        """The claim's UPDATE (parameters: run_id, now, by_worker, retries;
        and released_worker_N, released_at_N for N below ``released``)."""
        retries: BindParameter[Any] = bindparam("retries")
        claimable = [
            *(c.state == state for state in STARTABLE_STATES),
            (c.state == "running") & (c.celery_retries < retries),
            # Never started, waiting for its retry: declared lost because no
            # worker claimed it in time (a long queue), or its send reported
            # a failure although the message went out (the broker's answer
            # was lost). Its message is here, so it runs the window, and the
            # retry, which goes out only from ``retrying``, never does. Once
            # the retry went out this row is ``lost``/``failed`` and refuses.
            (c.state == "retrying") & c.started_at.is_(None),
        ]
        claimable.extend(
            (c.state == "running")
            & (c.worker == bindparam(f"released_worker_{n}"))
            & (c.started_at == bindparam(f"released_at_{n}", type_=UTCDateTime()))
            for n in range(released)
        )
        return (
            update(table)
            .where(c.id == bindparam("run_id"), or_(*claimable))
            # In this order: MySQL's SET reads the columns already set to
            # its left, so what the lost sweep wrote on a row claimed late
            # is cleared before ``state`` changes.
            .ordered_values(
                (c.reason, case((c.state == "retrying", None), else_=c.reason)),
                (c.error, case((c.state == "retrying", None), else_=c.error)),
                (c.retry_at, None),
                (c.finished_at, None),
                (c.state, "running"),
                (c.started_at, bindparam("now", type_=UTCDateTime())),
                (c.worker, bindparam("by_worker")),
                (c.deadline_at, deadline),
                (c.celery_retries, retries),
            )
        )

    def db_clock_plus(self, seconds: Any) -> Any:
        """The database's clock plus ``seconds``, as naive UTC, for a
        statement to write: PostgreSQL's ``now()``, MySQL's
        ``UTC_TIMESTAMP(6)``; SQLite has no clock of its own (the process
        clock, as :meth:`Store.db_now`)."""
        dialect = self.db.engine.dialect.name
        if dialect == "postgresql":
            if not isinstance(seconds, BindParameter):
                seconds = bindparam("lost_after", seconds)
            shift = func.make_interval(0, 0, 0, 0, 0, 0, seconds)
            return func.timezone("UTC", func.now()) + shift
        if is_mysql(self.db.engine):
            micros = round(float(seconds) * 1_000_000)
            return literal_column(f"UTC_TIMESTAMP(6) + INTERVAL {micros} MICROSECOND")
        return utc_now() + timedelta(seconds=seconds)

    def heartbeat(self, run_id: str, deadline_at: datetime) -> bool:
        """A running body's sign of life: push its ``deadline_at`` to at least
        ``deadline_at`` (a later one, from a hard time limit, is kept).
        False: the run is no longer ``running`` (declared lost, replaced)."""
        new = literal(deadline_at, UTCDateTime())
        stmt = (
            update(table)
            .where(c.id == run_id, c.state == "running")
            .values(deadline_at=deadline_no_earlier_than(new))
        )
        with self.db.write() as conn:
            return conn.execute(stmt).rowcount == 1

    def count_duplicate(self, run_id: str) -> str | None:
        """Count a refused delivery on the run; its state, or None if unknown."""
        stmt = update(table).where(c.id == run_id).values(duplicates=c.duplicates + 1)
        if is_mysql(self.db.engine):
            # No RETURNING: the UPDATE locks the row, so the state read after
            # it in the same transaction is the one it counted against.
            with self.db.write() as conn:
                if conn.execute(stmt).rowcount != 1:
                    return None
                return conn.execute(select(c.state).where(c.id == run_id)).scalar_one()
        with self.db.write() as conn:
            row = conn.execute(stmt.returning(c.state)).first()
        return row.state if row is not None else None

    def _outcome_statement(self, state: str) -> Update:
        """The outcome's UPDATE for ``state``, built once per state (parameters:
        run_id, finished, error, spend): building it cost more than running it."""
        built = self._outcome_statements
        if state not in built:
            values: dict[str, Any] = {
                "state": state,
                "finished_at": bindparam("finished", type_=UTCDateTime()),
                "error": bindparam("error"),
                "spend": bindparam("spend"),
            }
            startable = c.state == "running"
            if state == "succeeded":
                startable = or_(startable, (c.state == "retrying") & (c.reason == "lost"))
                values.update(retry_at=None, reason=None)
            built[state] = (
                update(table).where(c.id == bindparam("run_id"), startable).values(**values)
            )
        return built[state]

    @cached_property
    def _outcome_statements(self) -> dict[str, Update]:
        return {}

    @cached_property
    def _succeed_reading_ceiling(self) -> ReturningUpdate:
        ceiling: ColumnElement[Any] = (
            select(routines.c.ceiling).where(routines.c.id == c.routine_id).scalar_subquery()
        )
        return self._outcome_statement("succeeded").returning(ceiling.label("ceiling"))

    @cached_property
    def _succeed_compiled(self) -> DriverStatement:
        return DriverStatement.compile(self._succeed_reading_ceiling, self.db.engine.dialect)

    def succeed(
        self,
        run_id: str,
        now: datetime,
        *,
        spend: dict[str, float] | None,
        on: Connection | None = None,
    ) -> Finished:
        """``running`` -> ``succeeded`` with the outcome, telling in the same statement
        whether the run's routine has a ceiling (RETURNING a read of it), so a
        run of a routine without one needs no further read. MySQL has no
        RETURNING: there the answer is "check" and the check reads it.
        ``on``: as for :meth:`claim_start`.

        A success also lands on a run the lost sweep gave up on but whose
        retry has not gone out yet (``retrying``, reason ``lost``): it did
        finish, and taking it out of ``retrying`` cancels the retry."""
        params = _outcome_params(run_id, now, None, spend)
        if is_mysql(self.db.engine):
            stmt = self._outcome_statement("succeeded")
            with self._one_statement(on, transaction=True) as conn:
                return Finished(done=conn.execute(stmt, params).rowcount == 1, check_ceiling=True)
        with self._one_statement(on) as conn:
            if self._postgres:
                params["finished"] = naive_utc(now)
                row = self._succeed_compiled.execute(conn, params).first()
            else:
                row = conn.execute(self._succeed_reading_ceiling, params).first()
        if row is None:
            return Finished(done=False, check_ceiling=False)
        return Finished(done=True, check_ceiling=bool(row.ceiling))

    def requeue(
        self, run_id: str, *, celery_retries: int = 0, deadline_at: datetime | None = None
    ) -> None:
        """A task that called Celery's own ``self.retry()`` goes back to ``sent``:
        the redelivery is the same run, not one of our retries.

        Only while the delivery that retried still holds it: if the redelivery
        already claimed the row, it stays ``running``.
        """
        values: dict[str, Any] = {"state": "sent"}
        if deadline_at is not None:
            values["deadline_at"] = deadline_at
        stmt = (
            update(table)
            .where(c.id == run_id, c.state == "running", c.celery_retries == celery_retries)
            .values(**values)
        )
        with self.db.write() as conn:
            conn.execute(stmt)


def _outcome_params(
    run_id: str, now: datetime, error: str | None, spend: dict[str, float] | None
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "finished": now,
        "error": error,
        "spend": json.dumps(spend) if spend is not None else None,
    }
