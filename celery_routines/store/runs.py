"""The tick's queries on ``routine_runs``: writing a batch's run rows, finding
windows already written, marking runs sent, skipping late ones, settling,
the lost sweep and the open runs overlap reads. The retry hand-over
(``run_retries.py``), the worker's outcomes (``run_outcomes.py``), the
operator's reads and the panel's have query modules of their own."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    Integer,
    Select,
    String,
    any_,
    bindparam,
    func,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

import celery_routines.store.mysql as mysql_json

from .compiled import naive_utc
from .connections import connections_for
from .dialects import is_mysql
from .models import ROUTINE_RUNS, ROUTINES
from .pg_arrays import array_param, int_array, text_array, timestamp_array
from .records import (
    NewRun,
    OpenRun,
    RunRecord,
)
from .run_outcomes import deadline_no_earlier_than
from .run_retries import RECORD_COLUMNS, RETRYING, run_record
from .types import UTCDateTime

table = ROUTINE_RUNS
c = table.c
routines = ROUTINES
# Spelled exactly like the partial indexes' predicates: SQLite uses a partial
# index only for a query whose WHERE contains the same term.
OPEN = text("routine_runs.state IN ('pending', 'sent', 'running')")


# Most (routine_id, idempotency_key, attempt) triples one SQLite query looks up.
FIND_WINDOWS_SLICE = 1000

# insert_new on PostgreSQL; the column list must follow NewRun's fields.
UNNEST_INSERT = text(
    "INSERT INTO routine_runs (id, routine_id, idempotency_key, attempt, scheduled_for,"
    " state, reason, skipped_count, skipped_first, skipped_last, deadline_at, created_at) "
    "SELECT u.*, CAST(:now AS timestamp) FROM unnest("
    "CAST(:ids AS varchar[]), CAST(:routine_ids AS integer[]), CAST(:keys AS varchar[]),"
    " CAST(:attempts AS integer[]), CAST(:scheduled AS timestamp[]),"
    " CAST(:states AS varchar[]), CAST(:reasons AS text[]), CAST(:counts AS integer[]),"
    " CAST(:firsts AS timestamp[]), CAST(:lasts AS timestamp[]),"
    " CAST(:deadlines AS timestamp[])) AS u "
    "ON CONFLICT (routine_id, idempotency_key, attempt) DO NOTHING RETURNING id"
)


class RunQueries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.db = connections_for(engine)
        self._postgres = engine.dialect.name == "postgresql"
        self._mysql = is_mysql(engine)
        # The tick's statements, built once: building them cost more than running them.
        ids = (
            # PostgreSQL: one array parameter, not an IN list of a parameter
            # per run (500 per chunk, marked on a thread beside the publishing).
            # (a literal cast to varchar[]: see store/pg_arrays.py).
            c.id == any_(array_param("ids", String))
            if self._postgres
            else c.id.in_(bindparam("ids", expanding=True))
        )
        sent = update(table).where(ids, c.state == "pending")
        self._mark_sent = sent.values(state="sent", sent_at=bindparam("now"))
        # Marking never moves a deadline back: the send instant is the beat's
        # clock plus an offset measured at the tick's start, an hour early if
        # NTP stepped the clock back since; the deadline written with the row
        # (run_timeout after it was written) then stands.
        deadline = bindparam("deadline", type_=UTCDateTime())
        self._mark_sent_with_deadline = sent.values(
            state="sent",
            sent_at=bindparam("now"),
            deadline_at=deadline_no_earlier_than(deadline),
        )
        self._open_runs = self.open_runs_select(bindparam("ids", expanding=True))
        if self._postgres:
            # One array parameter: an expanding IN renders and binds a
            # parameter per routine (a thousand in a burst's tick).
            self._open_runs = self.open_runs_select(array_param("ids", Integer), any_of=True)
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert

    # -- beat ----------------------------------------------------------------

    def insert_new(self, runs: Sequence[NewRun], now: datetime) -> set[str]:
        """Write run rows in one statement; return the ids actually inserted.

        The unique ``(routine_id, idempotency_key, attempt)`` is the final
        arbiter of "one window fires once": a row that conflicts is not
        inserted and its id is not returned, whoever else wrote it first.
        (psycopg 3 reports rowcount -1 here, so RETURNING is the only reliable
        answer.)
        """
        if not runs:
            return set()
        if self._postgres:
            return self._insert_new_unnest(runs, now)
        if self._mysql:
            with self.db.write() as conn:
                return mysql_json.insert_runs(conn, runs, now)
        # One cached single-row statement executed with a parameter list:
        # SQLAlchemy batches it ("insertmanyvalues") and compiles it once,
        # where a multi-row VALUES would be compiled afresh for every batch.
        stmt = (
            self._insert(table)
            .on_conflict_do_nothing(index_elements=["routine_id", "idempotency_key", "attempt"])
            .returning(c.id)
        )
        rows = [{**run.__dict__, "created_at": now} for run in runs]
        with self.db.fast_write() as conn:
            return {row.id for row in conn.execute(stmt, rows)}

    def _insert_new_unnest(self, runs: Sequence[NewRun], now: datetime) -> set[str]:
        """PostgreSQL: the rows as one array per column, unnested server-side.
        A thousand rows cost one small statement instead of a thousand bound
        parameter sets converted one by one."""
        # Each array as one literal (store/pg_arrays.py): psycopg's own list
        # dumping cost more CPU than the rest of the statement.
        columns = {
            "ids": text_array([r.id for r in runs]),
            "routine_ids": int_array([r.routine_id for r in runs]),
            "keys": text_array([r.idempotency_key for r in runs]),
            "attempts": int_array([r.attempt for r in runs]),
            "scheduled": timestamp_array([r.scheduled_for for r in runs]),
            "states": text_array([r.state for r in runs]),
            "reasons": text_array([r.reason for r in runs]),
            "counts": int_array([r.skipped_count for r in runs]),
            "firsts": timestamp_array([r.skipped_first for r in runs]),
            "lasts": timestamp_array([r.skipped_last for r in runs]),
            "deadlines": timestamp_array([r.deadline_at for r in runs]),
            "now": naive_utc(now),
        }
        with self.db.fast_write() as conn:
            # Fetched at once: row by row cost more than the arrays above.
            return set(conn.execute(UNNEST_INSERT, columns).scalars().all())

    def find_windows(self, windows: Sequence[tuple[int, str, int]]) -> list[RunRecord]:
        """The stored runs of ``(routine_id, idempotency_key, attempt)`` triples."""
        if not windows:
            return []
        if self._postgres:
            return self._find_windows_unnest(windows)
        found: list[RunRecord] = []
        windows = list(windows)
        for start in range(0, len(windows), FIND_WINDOWS_SLICE):
            query = select(*RECORD_COLUMNS).where(
                tuple_(c.routine_id, c.idempotency_key, c.attempt).in_(
                    windows[start : start + FIND_WINDOWS_SLICE]
                )
            )
            with self.db.read() as conn:
                found.extend(run_record(row) for row in conn.execute(query))
        return found

    def _find_windows_unnest(self, windows: Sequence[tuple[int, str, int]]) -> list[RunRecord]:
        """PostgreSQL: the triples as three arrays joined on the unique index.
        A row-value IN list is parsed recursively (25,000 triples, as a
        takeover with catch-up can ask for, exceed the stack depth limit) and
        planned as one index probe per triple."""
        wanted = (
            select(
                func.unnest(array_param("rids", Integer)).label("rid"),
                func.unnest(array_param("keys", String)).label("key"),
                func.unnest(array_param("attempts", Integer)).label("att"),
            )
        ).subquery("wanted")
        query = select(*RECORD_COLUMNS).join(
            wanted,
            (c.routine_id == wanted.c.rid)
            & (c.idempotency_key == wanted.c.key)
            & (c.attempt == wanted.c.att),
        )
        params = {
            "rids": int_array([w[0] for w in windows]),
            "keys": text_array([w[1] for w in windows]),
            "attempts": int_array([w[2] for w in windows]),
        }
        with self.db.read() as conn:
            return [run_record(row) for row in conn.execute(query, params)]

    def still_pending(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these runs are still ``pending`` (written, not yet sent)."""
        if not run_ids:
            return set()
        query = select(c.id).where(c.id.in_(list(run_ids)), c.state == "pending")
        with self.db.fast_read() as conn:
            return {row.id for row in conn.execute(query)}

    def mark_sent(
        self, run_ids: Sequence[str], now: datetime, *, deadline_at: datetime | None = None
    ) -> None:
        """``pending`` -> ``sent``; a run the worker already started is left alone.

        ``deadline_at``: when the run is declared lost if no worker reports back.
        """
        if not run_ids:
            return
        if self._mysql:
            values = {"ids": mysql_json.ids(run_ids), "now": mysql_json.naive(now)}
            statement = mysql_json.MARK_SENT
            if deadline_at is not None:
                statement, values["deadline"] = (
                    mysql_json.MARK_SENT_WITH_DEADLINE,
                    mysql_json.naive(deadline_at),
                )
            with self.db.fast_write() as conn:
                conn.execute(statement, values)
            return
        ids = text_array(run_ids) if self._postgres else list(run_ids)
        params: dict[str, Any] = {"ids": ids, "now": now}
        stmt = self._mark_sent
        if deadline_at is not None:
            stmt, params["deadline"] = self._mark_sent_with_deadline, deadline_at
        with self.db.fast_write() as conn:
            conn.execute(stmt, params)

    def skip_late(self, run_id: str, now: datetime) -> bool:
        """``pending`` -> ``skipped`` (reason ``late``): judged at the moment of
        sending, so a long drain cannot send what is already too late."""
        stmt = (
            update(table)
            .where(c.id == run_id, c.state == "pending")
            .values(
                state="skipped",
                reason="late",
                skipped_count=1,
                skipped_first=c.scheduled_for,
                skipped_last=c.scheduled_for,
                finished_at=now,
            )
        )
        with self.db.write() as conn:
            return conn.execute(stmt).rowcount == 1

    def settle(
        self,
        run_id: str,
        *,
        from_states: Sequence[str],
        state: str,
        now: datetime,
        retry_at: datetime | None = None,
        reason: str | None = None,
        error: str | None = None,
        spend: dict[str, float] | None = None,
        overdue_at: datetime | None = None,
    ) -> bool:
        """Give a run its outcome (``failed``/``lost``/``retrying``), conditional
        on it still being in one of ``from_states`` (and, for the lost sweep,
        on its deadline having passed at ``overdue_at``): whoever moves it
        first wins, the others change nothing and are told so."""
        conditions = [c.id == run_id, c.state.in_(list(from_states))]
        if overdue_at is not None:
            conditions.append(c.deadline_at <= overdue_at)
        values: dict[str, Any] = {
            "state": state,
            "finished_at": now,
            "retry_at": retry_at,
            "reason": reason,
            "error": error,
        }
        if spend is not None:
            values["spend"] = json.dumps(spend)
        with self.db.write() as conn:
            return conn.execute(update(table).where(*conditions).values(**values)).rowcount == 1

    def fail_send(
        self,
        run_id: str,
        error: str,
        now: datetime,
        *,
        state: str,
        retry_at: datetime | None,
        reason: str | None,
    ) -> bool:
        """A publish that failed: ``pending`` -> ``retrying`` (or ``failed``)."""
        return self.settle(
            run_id,
            from_states=("pending",),
            state=state,
            now=now,
            retry_at=retry_at,
            reason=reason,
            error=error,
        )

    # -- the lost sweep ------------------------------------------------------

    def overdue_select(self, now: datetime, limit: int) -> Select[Any]:
        """Open runs whose deadline has passed, oldest deadline first: a range
        scan of ``ix_routine_runs_deadline``."""
        return (
            select(*RECORD_COLUMNS)
            .where(OPEN, c.deadline_at <= now)
            .order_by(c.deadline_at)
            .limit(limit)
        )

    def overdue(self, now: datetime, limit: int) -> list[RunRecord]:
        with self.db.fast_read() as conn:
            return [run_record(row) for row in conn.execute(self.overdue_select(now, limit))]

    def instant_columns(self) -> list[Any]:
        """The earliest ``retry_at`` of a retry and the earliest deadline of an
        open run, as scalar subqueries for the tick's probe (each reads the
        first entry of a partial index)."""
        retry = select(func.min(c.retry_at)).where(RETRYING).scalar_subquery()
        deadline = select(func.min(c.deadline_at)).where(OPEN).scalar_subquery()
        return [retry.label("retry_at"), deadline.label("deadline")]

    # -- overlap ---------------------------------------------------------------

    def open_runs_select(
        self, routine_ids: Sequence[int] | Any, any_of: bool = False
    ) -> Select[Any]:
        """The open runs of these routines (``ix_routine_runs_open``);
        ``any_of``: ``routine_ids`` is one PostgreSQL array parameter."""
        if isinstance(routine_ids, ColumnElement):
            which = c.routine_id == any_(routine_ids) if any_of else c.routine_id.in_(routine_ids)
        else:
            which = c.routine_id.in_(list(routine_ids))
        return select(c.id, c.routine_id, c.idempotency_key, c.state, c.deadline_at).where(
            OPEN, which
        )

    def open_runs(self, routine_ids: Sequence[int]) -> dict[int, list[OpenRun]]:
        if not routine_ids:
            return {}
        found: dict[int, list[OpenRun]] = {}
        with self.db.fast_read() as conn:
            ids = int_array(routine_ids) if self._postgres else list(routine_ids)
            for row in conn.execute(self._open_runs, {"ids": ids}):
                found.setdefault(row.routine_id, []).append(
                    OpenRun(row.id, row.routine_id, row.idempotency_key, row.state, row.deadline_at)
                )
        return found

    def mark_replaced(self, run_ids: Sequence[str], by: str, now: datetime) -> list[str]:
        """Open runs superseded by a newer window (``overlap="replace"``) ->
        ``failed`` with reason ``replaced``; the ids actually moved."""
        if not run_ids:
            return []
        moved = c.state.in_(("sent", "running"))
        values = {
            "state": "failed",
            "reason": "replaced",
            "error": f"replaced by {by}",
            "finished_at": now,
        }
        if self._mysql:
            # No RETURNING: lock the rows that qualify, then move exactly those.
            with self.db.write() as conn:
                found = select(c.id).where(c.id.in_(list(run_ids)), moved).with_for_update()
                ids = [row.id for row in conn.execute(found)]
                if ids:
                    conn.execute(update(table).where(c.id.in_(ids)).values(**values))
                return ids
        stmt = update(table).where(c.id.in_(list(run_ids)), moved).values(**values).returning(c.id)
        with self.db.write() as conn:
            return [row.id for row in conn.execute(stmt)]

    # -- lookups -------------------------------------------------------------

    def get(self, run_id: str) -> RunRecord | None:
        with self.db.read() as conn:
            row = conn.execute(select(*RECORD_COLUMNS).where(c.id == run_id)).first()
        return run_record(row) if row else None
