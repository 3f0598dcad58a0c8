"""Engines for the store: SQLite tuned for several processes, PostgreSQL as
is, MySQL/MariaDB in UTC, strict, at READ COMMITTED."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from ..errors import ConfigurationError
from .dialects import MYSQL_FAMILY, is_mysql

SQLITE_BUSY_TIMEOUT_MS = 30_000
# The driver of a MySQL/MariaDB URL that names none (``mysql://``): the one
# the ``mysql`` extra installs. SQLAlchemy's own default, mysqlclient, needs a
# C compiler and the client headers to install (see the README's store table).
MYSQL_DEFAULT_DRIVER = "pymysql"
SUPPORTED_BACKENDS = ("sqlite", "postgresql", *sorted(MYSQL_FAMILY))


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
    if backend not in SUPPORTED_BACKENDS:
        raise ConfigurationError(
            f"routines_database_url {url!r}: backend {backend!r} is not supported; "
            "use sqlite:///, postgresql:// or mysql+pymysql://"
        )
    if backend in MYSQL_FAMILY:
        return _mysql_engine(parsed)
    if backend == "sqlite":
        engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _configure_sqlite)
        event.listen(engine, "begin", _begin_immediate)
        return engine
    # Pre-ping costs a round trip per checkout, but without it every pooled
    # connection cut by a database restart fails one tick somewhere in its
    # middle, each followed by a longer back-off.
    return create_engine(parsed, pool_pre_ping=True, pool_size=5, max_overflow=5)


def _mysql_engine(parsed: Any) -> Engine:
    if "+" not in parsed.drivername:
        parsed = parsed.set(drivername=f"{parsed.drivername}+{MYSQL_DEFAULT_DRIVER}")
    if "charset" not in parsed.query:
        # Names and keys are utf8mb4 in the tables; a connection in the
        # three-byte "utf8" would refuse or mangle anything past the BMP.
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    try:
        engine = create_engine(
            parsed,
            # Each statement sees what is committed when it starts, as on
            # PostgreSQL; REPEATABLE READ would also take gap locks on the
            # claim's range scan and make concurrent beats wait on each other.
            isolation_level="READ COMMITTED",
            pool_pre_ping=True,
            pool_size=5,
            max_overflow=5,
            # Under the server's wait_timeout (8 h by default), which closes
            # idle connections from its side.
            pool_recycle=3600,
        )
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"routines_database_url uses {parsed.drivername}, whose driver is not "
            f"installed ({exc}); pip install 'celery-routines[mysql]'"
        ) from None
    event.listen(engine, "connect", _configure_mysql)
    return engine


def _configure_mysql(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # The tables hold naive UTC (DATETIME(6)); a session in UTC makes the
    # server's own NOW() and any conversion agree with them.
    cursor.execute("SET time_zone = '+00:00'")
    # Strict: a name or key too long for its column is an error, never a
    # silently truncated value that could make two windows collide.
    cursor.execute(
        "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_ALL_TABLES')"
    )
    cursor.close()


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
    """``engine`` for single statements: autocommit on PostgreSQL and MySQL
    (sharing the pool), unchanged on SQLite, whose writers must take the lock
    at BEGIN."""
    if engine.dialect.name == "postgresql" or is_mysql(engine):
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine
