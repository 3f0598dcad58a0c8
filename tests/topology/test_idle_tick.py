"""Issue 36, item 3: an idle tick in production is one statement and one
round trip on the wire.

The database's clock is read by the probe itself (a separate ``SELECT now()``
made an idle tick two statements), and the pool no longer pings a connection
the previous tick used a moment ago (SQLAlchemy's pre-ping, a ``;`` sent
before every checkout, made it two round trips). The ping's job, noticing a
connection cut while it sat in the pool, is done by trying a tick that fails
on a cut connection again at once."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event
from sqlalchemy.engine import make_url

from celery_routines import Scheduler, register
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published

pytestmark = pytest.mark.postgres


def _wire_trace(scheduler: Scheduler, path: Path) -> Any:
    """libpq's protocol trace of every connection of the beat's pool, from
    its next checkout on: what actually goes to the server, pings included."""
    import psycopg

    handle = path.open("w+b")
    traced: set[int] = set()

    def trace(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if id(dbapi_connection) not in traced:
            traced.add(id(dbapi_connection))
            dbapi_connection.pgconn.trace(handle.fileno())
            dbapi_connection.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)

    event.listen(scheduler.store.engine, "checkout", trace)
    return handle


def _round_trips(handle: Any, start: int) -> list[str]:
    """The statements the client sent after byte ``start``: one ``Query``
    (simple protocol: a ping) or one ``Sync`` (extended: a statement) each."""
    handle.flush()
    handle.seek(start)
    sent = []
    for line in handle.read().decode(errors="replace").splitlines():
        fields = line.split("\t")
        if len(fields) >= 3 and fields[0] == "F" and fields[2].split(" ")[0] in ("Query", "Sync"):
            sent.append(fields[2].split(" ")[0])
    return sent


def test_an_idle_production_tick_is_one_statement_and_one_round_trip(
    tmp_path: Path, postgres_url: str
) -> None:
    register("tasks.yearly", "0 0 1 1 *", name="yearly")
    # Beat on the real clock: it arbitrates on the database's clock. Short
    # refreshes so that the ticks below are as far apart as beat's longest
    # sleep, as an idle beat's are.
    app = filesystem_app(tmp_path / "broker", postgres_url, routines_refresh_seconds=0.3)
    scheduler = Scheduler(app)
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append(statement)

    handle = _wire_trace(scheduler, tmp_path / "trace")
    try:
        scheduler.tick()  # adopts the routine; checks the connection out (traced from now)
        scheduler.tick()
        # The beat's heartbeat (issue 33, tick/heartbeat.py) was written by the
        # first tick and adds its one statement at most every 5 s: not below.
        heartbeat = scheduler._beat_heartbeat
        assert heartbeat is not None and heartbeat.every == 5.0
        event.listen(scheduler.store.engine, "before_cursor_execute", record)
        start = handle.tell()
        ticks = 3
        for _ in range(ticks):
            time.sleep(0.3)  # beat's sleep between idle ticks (routines_refresh_seconds)
            assert scheduler.tick() > 0  # idle: beat sleeps
        # One statement per tick, and it is the probe reading the database's clock.
        assert len(statements) == ticks, statements
        assert all("statement_timestamp" in s and "routines" in s for s in statements)
        # On the wire: nothing else (no ping, no SELECT now()).
        assert _round_trips(handle, start) == ["Sync"] * ticks
    finally:
        event.remove(scheduler.store.engine, "before_cursor_execute", record)
        scheduler.close()
        handle.close()


def _cut_beats_connections(database_url: str) -> int:
    """pg_terminate_backend on every session of the test's database but ours:
    what a database restart or a proxy's idle timeout does to pooled connections."""
    url = make_url(database_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return len(
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %(db)s AND pid <> pg_backend_pid()",
                    {"db": url.database},
                ).all()
            )
    finally:
        admin.dispose()


def test_a_connection_cut_between_idle_ticks_costs_no_back_off(
    tmp_path: Path, postgres_url: str, clock: FakeClock
) -> None:
    """Without a ping at checkout the cut connection fails the next tick's
    first statement; that tick is tried again at once (sleep 0), and the
    window due meanwhile goes out then, not after an error back-off."""
    register("tasks.poll", timedelta(minutes=5), name="poll")
    folder = tmp_path / "broker"
    scheduler = Scheduler(filesystem_app(folder, postgres_url), clock=clock)
    try:
        scheduler.tick()  # adopts: first window in five minutes
        assert _cut_beats_connections(postgres_url) >= 1
        clock.advance(minutes=5)
        slept_before_sending = []
        while not published(folder) and len(slept_before_sending) < 3:
            slept_before_sending.append(scheduler.tick())
        assert len(published(folder)) == 1
        # A tick that failed on the cut connection asked for no sleep: the
        # window went out on its retry (or at once, had the pool pinged).
        assert slept_before_sending[:-1] in ([], [0.0]), slept_before_sending
    finally:
        scheduler.close()
