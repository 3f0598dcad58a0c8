"""Which errors mean the database could not be reached.

A failover, a pooler restart, a dropped NAT entry or a network blip reaches a
beat or a worker as a statement whose connection was cut, or a connection
that could not be opened. Those are expected in production and worth trying
again; a statement the server refused (a constraint, a cancelled query, a
missing table) or a bug is not, and must not be retried or logged as an
outage. Beat (``tick/backoff.py``) and the worker (``worker/outage.py``)
both ask here.
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError

# MySQL client errors that mean the server is away: can't connect (local,
# TCP), gone away, lost the connection, lost it at the handshake.
MYSQL_UNREACHABLE = frozenset({2002, 2003, 2006, 2013, 2055})
# SQLite has no connection to lose: only a file another process holds (a
# writer past the busy timeout) or one that cannot be opened is worth waiting out.
# The drivers whose own errors may escape SQLAlchemy's wrapping.
DRIVER_MODULES = frozenset({"pymysql", "MySQLdb", "psycopg", "psycopg2", "sqlite3"})
SQLITE_TRANSIENT = ("database is locked", "unable to open database file", "disk i/o error")


def connection_cut(exc: BaseException) -> bool:
    """True when ``exc`` says the connection died (the pool has replaced it)."""
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def database_unreachable(exc: BaseException) -> bool:
    """True when ``exc`` says the database could not be reached or dropped
    the connection (refused, no server taking writes yet, shutting down),
    not that it refused a statement (a deadlock is an OperationalError too).

    Most errors come wrapped by SQLAlchemy; a driver's own error can also
    escape unwrapped (PyMySQL's, from the rollback or commit that ends a
    block on a connection that just died), and so can the socket's."""
    if connection_cut(exc):
        return True
    if isinstance(exc, (OperationalError, InterfaceError)):
        return _driver_says_unreachable(exc.orig)
    if isinstance(exc, DBAPIError):
        return False
    if type(exc).__name__ in ("OperationalError", "InterfaceError") and (
        type(exc).__module__.split(".")[0] in DRIVER_MODULES
    ):
        return _driver_says_unreachable(exc)
    return isinstance(exc, ConnectionError)


def _driver_says_unreachable(orig: BaseException | None) -> bool:
    if type(orig).__module__.startswith("sqlite3"):
        return any(words in str(orig).lower() for words in SQLITE_TRANSIENT)
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is not None:  # psycopg: class 08 connection exception, 57P shutting down
        return str(sqlstate).startswith(("08", "57P"))
    code = orig.args[0] if orig is not None and orig.args else None
    if isinstance(code, int):  # PyMySQL
        return code in MYSQL_UNREACHABLE
    return True  # a client-side failure to connect (psycopg gives it no SQLSTATE)


# How PostgreSQL (SQLSTATE 42P01) and MySQL/MariaDB (1146) say a table is missing.
UNDEFINED_TABLE_SQLSTATE = "42P01"
MYSQL_NO_SUCH_TABLE = 1146


def tables_missing(exc: BaseException) -> bool:
    """True when ``exc`` says a table of the statement does not exist: the
    store's tables were dropped (or the database recreated empty), which is
    neither an outage nor a bug, and which migrating mends."""
    orig = getattr(exc, "orig", None) or exc
    driver = type(orig).__module__.split(".")[0]
    if driver not in DRIVER_MODULES:
        return False
    if driver == "sqlite3":
        return "no such table" in str(orig).lower()
    if driver in ("pymysql", "MySQLdb"):
        return bool(orig.args) and orig.args[0] == MYSQL_NO_SUCH_TABLE
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return sqlstate == UNDEFINED_TABLE_SQLSTATE


def cause_of(exc: BaseException) -> str:
    """``OperationalError: connection failed: ... Connection refused``: the
    driver's error class and its first line, without SQLAlchemy's dump of
    the statement and its parameters."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    return f"{type(orig).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def from_the_database(exc: BaseException) -> bool:
    """True when the database (or its driver) raised ``exc``: a refused
    statement, a constraint, missing tables. Anything else is the code's own
    error, a bug whose traceback someone has to read."""
    if isinstance(exc, SQLAlchemyError):
        return True
    orig = getattr(exc, "orig", None) or exc
    return type(orig).__module__.split(".")[0] in DRIVER_MODULES


def traceback_unless_unreachable(exc: BaseException) -> BaseException | None:
    """What a log line's ``exc_info`` gets: nothing for a database that could
    not be reached (expected in production: the line names its cause), the
    exception for anything else (a bug's traceback)."""
    return None if database_unreachable(exc) else exc
