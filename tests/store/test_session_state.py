"""Issue 29: nothing the store does on PostgreSQL outlives its transaction.

Behind PgBouncer in transaction pooling, each transaction (each autocommitted
statement) may run on another server connection: a ``SET``, a session
advisory lock, a temporary table, a ``LISTEN`` or a server-side prepared
statement left on one is missing from (or, worse, met by another client on)
the next. Every statement a beat, a worker and the migrations send is
recorded at the cursor and checked. Prepared statements are session state
too: they are used only on a connection that reaches the server directly.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from celery_routines import Scheduler, register
from tests.conftest import FakeClock
from tests.harness import filesystem_app, runs_of

pytestmark = [pytest.mark.postgres]

# Session-scoped state: SET/RESET (SET LOCAL ends with its transaction),
# LISTEN, PREPARE, temporary tables, cursors WITH HOLD, session advisory
# locks (the _xact_ ones end with their transaction), set_config(..., false).
SESSION_STATE = re.compile(
    r"^\s*(SET\s+(?!LOCAL\b)|RESET\b|DISCARD\b|LISTEN\b|UNLISTEN\b|PREPARE\b|LOAD\b"
    r"|CREATE\s+(GLOBAL\s+|LOCAL\s+)?TEMP(ORARY)?\b)"
    r"|\bDECLARE\b.*\bWITH\s+HOLD\b"
    r"|\bpg_(try_)?advisory_lock(_shared)?\s*\("
    r"|\bset_config\s*\([^)]*,\s*false\s*\)",
    re.IGNORECASE | re.DOTALL,
)


class Recorded:
    def __init__(self, engine: Any) -> None:
        self.statements: list[str] = []
        self.prepared: list[int] = []
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        self.statements.append(statement)
        self.prepared.append(cursor.connection.prepare_threshold)


def test_no_statement_of_a_beat_a_worker_or_the_migrations_leaves_session_state(
    tmp_path: Path, postgres_url: str, clock: FakeClock
) -> None:
    for n in range(3):
        register("tasks.poll", timedelta(minutes=1), name=f"poll-{n}", overlap="overlap")
    scheduler = Scheduler(filesystem_app(tmp_path / "broker", postgres_url), clock=clock)
    try:
        scheduler.tick()  # migrates the empty database (see below), declares, adopts
        store = scheduler.store
        recorder = Recorded(store.engine)
        for _ in range(7):  # psycopg's default prepares at the fifth execution
            clock.advance(minutes=1)
            scheduler.tick()
        # The worker's statements on each run: claim and start, then the outcome.
        for n in range(3):
            for run in runs_of(store, f"poll-{n}"):
                if run["state"] != "sent":
                    continue
                assert store.outcomes.claim_start(run["id"], "w1", clock.now, lost_after=60)
                assert store.outcomes.succeed(run["id"], clock.now, spend=None).done
        with store.engine.connect() as conn:
            prepared = conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar()
    finally:
        scheduler.close()
    statements = recorder.statements
    assert len(statements) > 50
    leaving = [s for s in statements if SESSION_STATE.search(s)]
    assert not leaving, leaving[:3]
    # Connected directly: psycopg prepares, per session (through a pooler it
    # does not: tests/faults/test_prepared_statements_real.py).
    assert set(recorder.prepared) == {5}
    assert prepared > 0


def test_the_migrations_leave_no_session_state(postgres_url: str) -> None:
    from celery_routines.store import Store

    store = Store.from_url(postgres_url)
    recorder = Recorded(store.engine)
    try:
        store.migrate()
    finally:
        store.dispose()
    assert len(recorder.statements) > 20  # every revision's DDL went through here
    leaving = [s for s in recorder.statements if SESSION_STATE.search(s)]
    assert not leaving, leaving[:3]


def test_the_check_finds_session_state() -> None:
    for statement in (
        "SET statement_timeout = 1000",
        "set search_path to x",
        "SELECT pg_advisory_lock(1)",
        "CREATE TEMP TABLE t (x int)",
        "LISTEN routines",
        "SELECT set_config('a.b', 'c', false)",
    ):
        assert SESSION_STATE.search(statement), statement
    for statement in (
        "SET LOCAL lock_timeout = 1000",
        "SELECT pg_advisory_xact_lock(1)",
        "SELECT set_config('a.b', 'c', true)",
        "UPDATE routines SET next_run_at = NULL",
    ):
        assert not SESSION_STATE.search(statement), statement
