"""A beat whose database fails one statement, any statement, of its ticks.

:class:`FailingStatement` hooks a beat's own SQLAlchemy engine (every
statement of every thread of that beat goes through it: the tick's, the
marking thread's, the next batch's) and makes its n-th statement from the
moment it is armed fail once, with the error PgBouncer gave psycopg's
prepared statements (issue 29). ``before``: the statement never reaches the
server; ``after``: the server ran it (and committed it, outside a
transaction) but the beat is told it failed, as a connection cut before the
answer arrives. It is still a real database: only the answer of one
statement is replaced.

:func:`run_cell` is one cell of the matrix statement x beats -> task ids
published twice: several in-process beats (real PostgreSQL, kombu's
filesystem transport, an injected clock) tick in turn over a few windows of
a burst bigger than one claim and sent in several chunks, the first beat's
n-th statement fails; every published message is counted per task id.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, event, text

from celery_routines import Scheduler, register
from celery_routines.sending import sender
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published

ROUTINES = 12
BATCH = 5  # a burst: three claims, the next batch written while one publishes
CHUNK = 2  # several chunks a claim, each marked sent behind the next
LOCK_TTL = 10
WINDOWS = 2


class FailingStatement:
    """Fails the ``nth`` statement counted after :meth:`arm`.

    ``mode``: ``before``, that statement never reaches the server; ``after``,
    the server ran it but the beat is told it failed; ``connection``, as
    ``before``, and every later statement on any driver connection the beat
    had opened by then fails too (but ROLLBACK) until that connection is
    discarded: what psycopg's prepared statements did behind PgBouncer (each
    pooled connection had its statements prepared; their names, cached on the
    client, were missing on the server connections met next), or what a
    failover leaves in a pool; a fresh connection works.
    """

    def __init__(self, engine: Engine, nth: int | None, mode: str = "before") -> None:
        self.nth = nth
        self.mode = mode
        self.counted = 0
        self.armed = False
        self.failed: str | None = None
        self.failures = 0
        self._poisoned: weakref.WeakSet[Any] = weakref.WeakSet()
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def arm(self) -> None:
        self.armed = True

    def _fail(self, statement: str) -> None:
        self.failures += 1
        if self.failed is None:
            self.failed = " ".join(statement.split())[:90]
        raise psycopg.errors.InvalidSqlStatementName(
            f'injected: prepared statement "_pg3_{self.nth}" does not exist'
        )

    def _hit(self, when: str, cursor: Any, statement: str) -> None:
        self._seen.add(cursor.connection)
        if when == "before" and cursor.connection in self._poisoned:
            if statement.strip().upper() != "ROLLBACK":
                self._fail(statement)
            return
        if not self.armed or when != ("after" if self.mode == "after" else "before"):
            return
        with self._lock:
            self.counted += 1
            hit = self.counted == self.nth
        if hit:
            if self.mode == "connection":
                self._poisoned.update(self._seen)
            self._fail(statement)

    def _before(self, _conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self._hit("before", cursor, statement)

    def _after(self, _conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self._hit("after", cursor, statement)


@dataclass
class Cell:
    nth: int
    beats: int
    mode: str
    then: str
    statement: str | None  # the statement that failed (None: n past the last)
    messages: int
    doubled: int
    runs: int


def run_cell(
    folder: Path,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    nth: int | None,
    beats: int,
    mode: str = "before",
    then: str = "ticks",
) -> tuple[Cell, FailingStatement]:
    """``then``: ``ticks``, the failing beat carries on; ``stops``, it is
    closed right after its failing tick (it writes down what it published
    and hands its claims back) and another beat starts in its place."""
    monkeypatch.setattr(sender, "PUBLISH_CHUNK", CHUNK)
    clock = FakeClock(_start())
    for n in range(ROUTINES):
        register("tasks.poll", timedelta(minutes=1), name=f"poll-{n:02d}", overlap="overlap")
    conf = {"routines_lock_ttl": LOCK_TTL, "routines_batch_size": BATCH}

    def beat() -> Scheduler:
        return Scheduler(filesystem_app(folder, database_url, **conf), clock=clock)

    running = [beat() for _ in range(beats)]
    try:
        for _ in range(ROUTINES // BATCH + 1):  # adopts: one grid, every routine due at 12:01
            running[0].tick()
        clock.advance(minutes=1)
        fault = FailingStatement(running[0].store.engine, nth, mode)
        fault.arm()
        # The first beat's burst, tick after tick at 12:01 (as beat does
        # while more is due), its n-th statement failing.
        for _ in range(ROUTINES // BATCH + 1):
            if running[0].tick() > 0:
                break
        _settle_background(running[0])
        fault.armed = False
        if then == "stops":
            running[0].close()
            running[0] = beat()
        # Then every beat in turn: a second apart while the first beat's
        # claims may still hold, then five (two more windows).
        close = clock.now + timedelta(seconds=LOCK_TTL + 5)
        end = clock.now + timedelta(minutes=WINDOWS - 1, seconds=30)
        while clock.now < end:
            for scheduler in running:
                scheduler.tick()
            clock.advance(seconds=1 if clock.now < close else 5)
        counts = Counter(m["id"] for m in published(folder))
        checking = create_engine(database_url)  # not the failing beat's engine
        try:
            with checking.connect() as conn:
                runs = conn.execute(text("SELECT count(*) FROM routine_runs")).scalar_one()
                pending = conn.execute(
                    text("SELECT count(*) FROM routine_runs WHERE state = 'pending'")
                ).scalar_one()
        finally:
            checking.dispose()
        assert pending == 0, f"{pending} run(s) left pending"
        cell = Cell(
            nth=nth or 0,
            beats=beats,
            mode=mode,
            then=then,
            statement=fault.failed,
            messages=sum(counts.values()),
            doubled=sum(1 for n in counts.values() if n > 1),
            runs=runs,
        )
        return cell, fault
    finally:
        for scheduler in running:
            scheduler.close()


def _settle_background(scheduler: Scheduler) -> None:
    """Let the statements a tick leaves running on other threads (the next
    batch, a marking) finish while the fault is armed: they are the tick's."""
    engine = scheduler.engine
    for helper in (engine.ahead, engine.marking):
        thread = getattr(helper, "_thread", None) if helper is not None else None
        if thread is not None:
            thread.join()


def _start() -> Any:
    from datetime import UTC, datetime

    return datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
