"""The worker's database connection: kept between runs, pinged only after it
sat idle; a statement cut by a connection that died meanwhile is tried again
at once on a fresh one, and one that cannot reach the database is tried again
for ``routines_database_patience`` (:mod:`celery_routines.worker.outage`)."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Connection, Engine

from celery_routines.store import Store
from celery_routines.worker.outage import Attempts, patiently

logger = logging.getLogger("celery_routines.worker")
T = TypeVar("T")

# A connection idle this long is pinged before the worker uses it; one used
# more recently is not (a run's claim and outcome come back to back).
PING_AFTER_IDLE = 1.0
# Connections kept between runs per process: a prefork or solo pool process
# runs one body at a time; the threads of a threads pool beyond this one
# check connections out of the pool as before.
KEEP = 1


class KeptConnection:
    """The connection a worker process runs its claim and outcome on, kept
    checked out between runs (PostgreSQL, in autocommit).

    Checking a connection out of the pool for each of a run's two statements
    (checkout and return, autocommit switched on and off, the reset on
    return) cost the worker about 0.2 ms of CPU per run, a third of all the
    CPU its claim and outcome took (measured in one process, 2026-12-01).
    A kept connection idle for :data:`PING_AFTER_IDLE` is pinged before use,
    as the pool does at checkout; a pool process forked from a process that
    kept one never touches it (the parent's socket). :meth:`close` returns it
    to the pool (no engine event does: a listener on the engine would make
    SQLAlchemy dispatch events around every statement of the store).
    """

    def __init__(self, engine: Engine, ping_after_idle: float = PING_AFTER_IDLE) -> None:
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._dialect = engine.dialect
        self._ping_after_idle = ping_after_idle
        self._idle: list[tuple[Connection, float]] = []
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def run(self, statement: Callable[[Connection], T]) -> T:
        """Run one autocommitted statement on the kept connection (a cut one
        is dropped; :func:`run_statement` tries again on a fresh one)."""
        with self.connection() as conn:
            return statement(conn)

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """The kept connection, or one from the pool when it is in use; kept
        again afterwards unless the block failed (then returned to the pool,
        or dropped if it was cut)."""
        conn = self._take()
        try:
            yield conn
            conn.commit()  # ends SQLAlchemy's own transaction; the database autocommitted
        except BaseException:
            _release(conn)
            raise
        self._keep(conn)

    def _take(self) -> Connection:
        with self._lock:
            self._forget_if_forked()
            kept = self._idle.pop() if self._idle else None
        if kept is not None:
            conn, used_at = kept
            if time.monotonic() - used_at < self._ping_after_idle or self._alive(conn):
                return conn
            _release(conn)  # cut while idle (a restart, an idle timeout): replaced
        return self._engine.connect()

    def _keep(self, conn: Connection) -> None:
        with self._lock:
            self._forget_if_forked()
            if len(self._idle) < KEEP:
                self._idle.append((conn, time.monotonic()))
                return
        _release(conn)

    def _alive(self, conn: Connection) -> bool:
        try:
            dbapi_connection = conn.connection.dbapi_connection
            if dbapi_connection is not None and self._dialect.do_ping(dbapi_connection):
                return True
        except Exception:
            pass
        conn.invalidate()
        return False

    def _forget_if_forked(self) -> None:
        # Under the lock. Kept by the parent: its socket, never ours to use or close.
        if self._pid != os.getpid():
            self._idle.clear()
            self._pid = os.getpid()

    def close(self) -> None:
        """Return the kept connection to the pool (before disposing of the engine)."""
        with self._lock:
            self._forget_if_forked()
            kept, self._idle[:] = list(self._idle), []
        for conn, _used_at in kept:
            _release(conn)


def _release(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:
        logger.debug("could not return a worker connection to the pool", exc_info=True)


_kept: weakref.WeakKeyDictionary[Store, KeptConnection] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


def kept_for(store: Store) -> KeptConnection | None:
    """The kept connection of ``store`` (PostgreSQL), or None: elsewhere the
    store checks its connections out itself."""
    if store.engine.dialect.name != "postgresql":
        return None
    kept = _kept.get(store)
    if kept is None:
        with _kept_lock:
            kept = _kept.get(store)
            if kept is None:
                kept = _kept[store] = KeptConnection(store.engine)
    return kept


def close_kept(store: Store) -> None:
    """Return ``store``'s kept connection to its pool, if it has one."""
    with _kept_lock:
        kept = _kept.pop(store, None)
    if kept is not None:
        kept.close()


def run_statement(
    store: Store,
    statement: Callable[[Connection | None, Attempts], T],
    *,
    what: str,
    patience: float,
) -> T:
    """Run one of the worker's per-run statements: on the kept connection
    where there is one, else on a connection the store checks out (``None``);
    through a database that cannot be reached for up to ``patience`` seconds
    (then :class:`~celery_routines.worker.outage.DatabaseUnreachable`).
    ``statement`` is told the attempts so far: after an uncertain one it
    must allow for that attempt having landed."""
    kept = kept_for(store)

    def once(attempts: Attempts) -> T:
        if kept is None:
            return statement(None, attempts)
        return kept.run(lambda conn: statement(conn, attempts))

    return patiently(once, what=what, patience=patience)
