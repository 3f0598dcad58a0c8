"""A tick's bookkeeping after its messages went out, in one statement on
PostgreSQL: the published runs ``pending`` -> ``sent`` and the routines moved
to their next window (their claims released).

Issue 11's rule still holds: nothing written here can undo the publishing.
The statement is atomic: if it fails (a deadlock, a dropped connection, a
failover) neither part is written, both stay in the beat's ledger
(:mod:`celery_routines.tick.ledger`), and the next tick writes them before it
reads anything else, so nothing is published twice. Elsewhere (SQLite,
MySQL) the two parts stay a statement each (``RunQueries.mark_sent``, then
``RoutineQueries.advance``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, text

from .compiled import naive_utc
from .connections import connections_for
from .pg_arrays import int_array, text_array, timestamp_array
from .routines import Advance

# The advance locks the routines it moves in id order (the SELECT ... FOR
# UPDATE), as renew_claims and claim_due do: beats whose sets overlap after a
# takeover wait for each other instead of deadlocking.
RECORD_PUBLISHED = text(
    "WITH marked AS ("
    " UPDATE routine_runs AS r SET state = 'sent', sent_at = u.sent_at,"
    # A deadline is never moved back (see RunQueries' mark-sent).
    " deadline_at = GREATEST(r.deadline_at, u.deadline)"
    " FROM unnest(CAST(:ids AS varchar[]), CAST(:sent_ats AS timestamp[]),"
    " CAST(:deadlines AS timestamp[])) AS u(id, sent_at, deadline)"
    # The ANY() makes it a primary-key probe per run whatever the estimates.
    " WHERE r.id = ANY(CAST(:ids AS varchar[])) AND r.id = u.id AND r.state = 'pending'"
    " RETURNING 1"
    "), held AS ("
    " SELECT id FROM routines WHERE id = ANY(CAST(:rids AS integer[])) AND locked_by = :holder"
    " ORDER BY id FOR UPDATE"
    "), advanced AS ("
    " UPDATE routines AS t SET next_run_at = a.nra, locked_by = NULL, locked_until = NULL,"
    " last_error = NULL, updated_at = CAST(:now AS timestamp)"
    " FROM unnest(CAST(:rids AS integer[]), CAST(:nras AS timestamp[])) AS a(rid, nra)"
    " JOIN held ON held.id = a.rid"
    " WHERE t.id = a.rid RETURNING 1"
    ") SELECT (SELECT count(*) FROM marked) AS marked, (SELECT count(*) FROM advanced) AS advanced"
)


@dataclass(frozen=True)
class Published:
    """One published run to mark ``sent``: when, and its lost deadline."""

    run_id: str
    sent_at: datetime
    deadline_at: datetime


class BookkeepingQueries:
    def __init__(self, engine: Engine) -> None:
        self.db = connections_for(engine)
        # One statement for both parts where the database can (see the module docstring).
        self.one_statement = engine.dialect.name == "postgresql"

    def record_published(
        self, runs: Sequence[Published], advances: Sequence[Advance], holder: str, now: datetime
    ) -> int:
        """Mark ``runs`` sent (those still ``pending``) and move ``advances``
        on (those ``holder`` still claims), atomically; the routines moved."""
        params = {
            # Arrays as literals the statement casts (see store/pg_arrays.py).
            "ids": text_array([run.run_id for run in runs]),
            "sent_ats": timestamp_array([run.sent_at for run in runs]),
            "deadlines": timestamp_array([run.deadline_at for run in runs]),
            "rids": int_array([advance.routine_id for advance in advances]),
            "nras": timestamp_array([advance.next_run_at for advance in advances]),
            "holder": holder,
            "now": naive_utc(now),
        }
        with self.db.fast_write() as conn:
            return int(conn.execute(RECORD_PUBLISHED, params).one().advanced)
