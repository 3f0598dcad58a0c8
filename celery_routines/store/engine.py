"""Engines for the store: SQLite tuned for several processes, PostgreSQL as
is, MySQL/MariaDB in UTC, strict, at READ COMMITTED."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

from ..errors import ConfigurationError
from .dialects import MYSQL_FAMILY, is_mysql
from .prepared import chooser as prepare_chooser

if TYPE_CHECKING:
    import sqlite3

SQLITE_BUSY_TIMEOUT_MS = 30_000
# The driver of a MySQL/MariaDB URL that names none (``mysql://``): the one
# the ``mysql`` extra installs. SQLAlchemy's own default, mysqlclient, needs a
# C compiler and the client headers to install (see the README's store table).
MYSQL_DEFAULT_DRIVER = "pymysql"
SUPPORTED_BACKENDS = ("sqlite", "postgresql", *sorted(MYSQL_FAMILY))


def make_engine(
    url: str, *, ping_after_idle: float | None = None, prepared_statements: str = "auto"
) -> Engine:
    """An engine for ``url``; SQLite gets WAL and a busy timeout so that beat
    and worker processes can share one file.

    ``ping_after_idle`` (PostgreSQL): ping a pooled connection at checkout
    only if it sat idle in the pool at least this many seconds, instead of at
    every checkout (see :func:`_ping_if_idle`). ``prepared_statements``
    (PostgreSQL, psycopg 3): ``auto``, ``on`` or ``off`` (see
    :mod:`celery_routines.store.prepared`).
    """
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
    try:
        if backend == "sqlite":
            engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
            event.listen(engine, "connect", _configure_sqlite)
            event.listen(engine, "begin", _begin_immediate)
            return engine
        # Pre-ping costs a round trip per checkout, but without it every pooled
        # connection cut by a database restart fails one tick somewhere in its
        # middle, each followed by a longer back-off.
        driver_url = postgres_driver(parsed)
        engine = create_engine(
            driver_url,
            pool_pre_ping=ping_after_idle is None,
            pool_size=5,
            max_overflow=5,
            connect_args=postgres_connect_args(driver_url),
        )
        if ping_after_idle is not None:
            _ping_if_idle(engine, ping_after_idle)
        event.listen(engine, "handle_error", _discard_mismatched_session)
        if driver_url.get_driver_name() == "psycopg" and prepared_statements != "off":
            event.listen(engine, "connect", prepare_chooser(prepared_statements))
        return engine
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"routines_database_url {parsed.render_as_string(hide_password=True)!r} needs the "
            f"driver module {exc.name!r}, which is not installed: install the postgres extra "
            "(psycopg 3: pip install 'celery-routines[postgres]') and write postgresql:// or "
            "postgresql+psycopg://"
        ) from None


def _ping_if_idle(engine: Engine, idle: float) -> None:
    """Pre-ping only connections that sat in the pool ``idle`` seconds or more.

    A worker checks a connection out twice per run (the claim, the outcome),
    back to back: pinging each time doubled its round trips. A connection
    cut while idle (a database restart, a proxy's idle timeout) is still
    caught at checkout and replaced, as SQLAlchemy's own pre-ping does (its
    documented "pessimistic disconnect handling" with a custom ping); one cut
    within ``idle`` seconds of its last use fails its statement, which the
    worker retries once on a fresh connection (see ``worker.hooks``).
    """

    @event.listens_for(engine, "checkin")
    def _used(_dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        record.info["routines_used_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(
        dbapi_connection: DBAPIConnection,
        record: ConnectionPoolEntry,
        _proxy: PoolProxiedConnection,
    ) -> None:
        used_at = record.info.get("routines_used_at")
        if used_at is None or time.monotonic() - used_at < idle:
            return  # fresh from connect, or used a moment ago
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception:
            alive = False
        if not alive:
            raise DisconnectionError("pooled connection failed its ping")  # the pool reconnects


# SQLSTATEs that say the client's idea of its server session is wrong: a
# prepared statement missing or named twice, a Bind that does not fit the
# statement prepared under that name. Each means the connection's server
# session changed under it (a pooler in transaction mode) or its state was
# lost; every later statement on it may fail the same way.
SESSION_MISMATCH_SQLSTATES = frozenset({"26000", "42P05", "08P01"})


def _discard_mismatched_session(context: ExceptionContext) -> None:
    """Treat a session mismatch as a lost connection: this connection (only
    this one) is discarded and the next checkout opens a fresh session, so
    one mismatch fails one statement instead of every later tick on it."""
    sqlstate = getattr(context.original_exception, "sqlstate", None)
    if sqlstate in SESSION_MISMATCH_SQLSTATES:
        context.is_disconnect = True
        context.invalidate_pool_on_disconnect = False


def postgres_connect_args(url: URL) -> dict[str, Any]:
    """psycopg 3 without server-side prepared statements until a connection
    shows it reaches the server directly (:mod:`celery_routines.store.prepared`).

    psycopg 3 prepares a statement on the server after its fifth execution
    on a connection (``prepare_threshold``) and later sends only its name.
    A prepared statement belongs to one server session; behind PgBouncer in
    transaction pooling (PgBouncer before 1.21, or any without
    ``max_prepared_statements``) the next transaction may run on another
    server connection, where that name is missing or, worse, names another
    statement: "prepared statement "_pg3_7" does not exist", "bind message
    supplies 7 parameters, but prepared statement "_pg3_7" requires 1".
    So every connection starts with it off; on a bare PostgreSQL, planning
    each statement again cost about 1.5 ms on the idle tick's probe and
    0.5 ms per run a tick sends (benchmarks/prepared_statements.py, figures
    in docs/pgbouncer.md), which is why a connection that reaches the server
    directly turns it on (:mod:`celery_routines.store.prepared`). psycopg2
    never prepares.
    """
    if url.get_driver_name() == "psycopg":
        return {"prepare_threshold": None}
    return {}


def postgres_driver(url: URL, importable: Callable[[str], bool] | None = None) -> URL:
    """``url`` with a bare ``postgresql://`` pinned to psycopg 3 when it is installed.

    SQLAlchemy 2.0 reads a bare ``postgresql://`` as psycopg2 (2.1 as psycopg
    3), while the ``postgres`` extra installs psycopg 3: without this, the URL
    the README shows fails with "No module named 'psycopg2'" on 2.0. A URL
    naming its driver (``postgresql+psycopg2://``) is left alone, and so is a
    bare one where only psycopg2 is installed.
    """
    if url.drivername != "postgresql":
        return url
    found = importable or _importable
    if found("psycopg") or not found("psycopg2"):
        return url.set(drivername="postgresql+psycopg")
    return url


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _mysql_engine(parsed: URL) -> Engine:
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
            f"routines_database_url {parsed.render_as_string(hide_password=True)!r} needs the "
            f"driver module {exc.name!r}, which is not installed: install the mysql extra "
            "(PyMySQL: pip install 'celery-routines[mysql]') and write mysql:// or "
            "mysql+pymysql://"
        ) from None
    event.listen(engine, "connect", _configure_mysql)
    return engine


def _configure_mysql(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
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


def _configure_sqlite(dbapi_connection: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
    # Let SQLAlchemy issue BEGIN itself (see _begin_immediate), per its docs.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _begin_immediate(connection: Connection) -> None:
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


# -- what a failed connection means, in one line ------------------------------

_MISSING_DATABASE = re.compile(
    r'database "(?P<name>[^"]+)" does not exist'  # PostgreSQL
    r"|Unknown database '(?P<mysql_name>[^']+)'"  # MySQL/MariaDB 1049
)
_MISSING_ROLE = re.compile(r'role "(?P<name>[^"]+)" does not exist')
# How PostgreSQL, SQLite and MySQL/MariaDB (1146, 1054) say that a table or a
# column is missing: a schema that was never migrated, or migrated by an older
# version.
_SCHEMA_SIGNS = (
    "no such table",
    "no such column",
    re.compile(r'relation "[^"]+" does not exist'),
    re.compile(r"column \S+ does not exist"),
    re.compile(r"Table '[^']+' doesn't exist"),
    "unknown column",
)
_UNREACHABLE_SIGNS = (
    "connection refused",
    "could not connect",
    "failed to resolve host",
    "could not translate host name",
    "name or service not known",
    "timeout expired",
    "no route to host",
    "network is unreachable",
    "no such file or directory",  # a Unix socket path with no server behind it
    "server closed the connection",
    "can't connect to mysql server",  # MySQL/MariaDB 2002, 2003
    "can't connect to local server",
    "lost connection to server",
    "server has gone away",
)


def explain_database_error(exc: BaseException, url: str | None) -> str:
    """One line for a database error a user can act on: which of "the
    database does not exist", "the schema is old", "cannot reach the server"
    (or "the login was refused") it is, and the fix. The password of ``url``
    is masked."""
    driver_error = getattr(exc, "orig", None) or exc
    text = " ".join(str(driver_error).split()) or type(driver_error).__name__
    lowered = text.lower()
    parsed = _parse(url)
    where = _where(parsed)
    shown = parsed.render_as_string(hide_password=True) if parsed is not None else "?"
    missing = _MISSING_DATABASE.search(text)
    if missing and missing["mysql_name"]:
        name = missing["mysql_name"]
        return (
            f"the database {name!r} does not exist on {where}: create it (for example "
            f"`CREATE DATABASE {name} CHARACTER SET utf8mb4`) [routines_database_url {shown}]"
        )
    if missing:
        name = missing["name"]
        return (
            f"the database {name!r} does not exist on {where}: create it "
            f"(for example `createdb {_createdb_flags(parsed)}{name}`) "
            f"[routines_database_url {shown}]"
        )
    sqlite = parsed is not None and parsed.get_backend_name() == "sqlite"
    if sqlite and parsed is not None and "unable to open database file" in lowered:
        folder = os.path.dirname(os.path.abspath(parsed.database or "")) or "."
        return (
            f"the SQLite database {parsed.database!r} cannot be opened: does its folder "
            f"exist and can this user write to it? (for example `mkdir -p {folder}`)"
        )
    role = _MISSING_ROLE.search(text)
    if role:
        return (
            f"the server at {where} has no user {role['name']!r}: create it (for example "
            f"`createuser {role['name']}`) or fix routines_database_url {shown}"
        )
    if (
        "password authentication failed" in lowered
        or "no password supplied" in lowered
        or "access denied for user" in lowered  # MySQL/MariaDB 1045
    ):
        return f"the server at {where} refused the login: check the user and password in {shown}"
    if any(
        sign.search(text) if isinstance(sign, re.Pattern) else sign in lowered
        for sign in _SCHEMA_SIGNS
    ):
        return (
            f"the schema of {shown} is missing or older than this version of "
            f"celery-routines ({_first_line(driver_error)}): "
            f"run `celery -A {app_argument()} routines migrate`"
        )
    if any(sign in lowered for sign in _UNREACHABLE_SIGNS):
        return (
            f"cannot connect to the database server at {where}: is it running there? "
            f"({_first_line(driver_error)}) [routines_database_url {shown}]"
        )
    return f"database error: {_first_line(driver_error)} [routines_database_url {shown}]"


def app_argument(argv: list[str] | None = None) -> str:
    """The app this ``celery`` command was given (``-A proj``, ``--app=proj``,
    ``CELERY_APP``), to write a command the user can paste; ``<app>`` when
    there is none (a script using the API)."""
    args = sys.argv if argv is None else argv
    for index, arg in enumerate(args):
        if arg in ("-A", "--app") and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--app="):
            return arg.split("=", 1)[1]
        if arg.startswith("-A") and len(arg) > 2:
            return arg[2:]
    return os.environ.get("CELERY_APP") or "<app>"


def _parse(url: str | None) -> URL | None:
    if not url:
        return None
    try:
        return make_url(url)
    except Exception:
        return None


def _where(parsed: URL | None) -> str:
    if parsed is None:
        return "the configured server"
    if parsed.get_backend_name() == "sqlite":
        return repr(parsed.database or ":memory:")
    default_ports = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}
    port = parsed.port or default_ports.get(parsed.get_backend_name())
    host = parsed.host or "localhost (Unix socket)"
    return f"{host}:{port}" if port else host


def _createdb_flags(parsed: URL | None) -> str:
    if parsed is None or parsed.get_backend_name() != "postgresql":
        return ""
    flags = ""
    if parsed.host:
        flags += f"-h {parsed.host} "
    if parsed.port:
        flags += f"-p {parsed.port} "
    if parsed.username:
        flags += f"-U {parsed.username} "
    return flags


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].strip()


def safe_url(url: str) -> str:
    """The URL with its password hidden, for logs and answers."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable url>"
