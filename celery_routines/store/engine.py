"""Engines for the store: SQLite tuned for several processes, PostgreSQL as is."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from ..errors import ConfigurationError

SQLITE_BUSY_TIMEOUT_MS = 30_000


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL and a busy timeout so that beat
    and worker processes can share one file."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ConfigurationError(
            f"routines_database_url {url!r} is not a SQLAlchemy URL: {exc}"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ConfigurationError(
            f"routines_database_url {url!r}: backend {backend!r} is not supported; "
            "use sqlite:/// or postgresql://"
        )
    if backend == "sqlite":
        engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _configure_sqlite)
        event.listen(engine, "begin", _begin_immediate)
        return engine
    # Pre-ping costs a round trip per checkout, but without it every pooled
    # connection cut by a database restart fails one tick somewhere in its
    # middle, each followed by a longer back-off.
    return create_engine(parsed, pool_pre_ping=True, pool_size=5, max_overflow=5)


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy issue BEGIN itself (see _begin_immediate), per its docs.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _begin_immediate(connection: Any) -> None:
    # Take the write lock at BEGIN: a deferred transaction that reads and then
    # writes can fail with "database is locked" instead of waiting its turn.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def fast_engine(engine: Engine) -> Engine:
    """``engine`` for single statements: autocommit on PostgreSQL (sharing the
    pool), unchanged on SQLite, whose writers must take the lock at BEGIN."""
    if engine.dialect.name == "postgresql":
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine


def safe_url(url: str) -> str:
    """The URL with its password hidden, for logs and answers."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable url>"
