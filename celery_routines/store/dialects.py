"""What the store needs to know about each database family.

MySQL and MariaDB share one code path: SQLAlchemy names the dialect
``mysql`` or ``mariadb`` after the URL's scheme, not after the server.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Dialect, Engine, func
from sqlalchemy.sql.elements import ColumnElement

MYSQL_FAMILY = frozenset({"mysql", "mariadb"})

# Every table on MySQL/MariaDB: InnoDB (row locks, SKIP LOCKED, foreign keys)
# and utf8mb4 for names in any script. SQLAlchemy reads each option under the
# prefix of the URL's dialect. The migrations add the collation (see
# ``table_options``), which depends on the server.
_MYSQL_TABLE_OPTIONS = {"engine": "InnoDB", "charset": "utf8mb4"}


def _prefixed(options: dict[str, str]) -> dict[str, Any]:
    return {
        f"{prefix}_{option}": value
        for prefix in sorted(MYSQL_FAMILY)
        for option, value in options.items()
    }


TABLE_OPTIONS: dict[str, Any] = _prefixed(_MYSQL_TABLE_OPTIONS)


def binary_collation(dialect: Dialect) -> str:
    """A binary collation without padding: names and keys compare byte for
    byte, as on PostgreSQL and SQLite. A server's default collation makes
    "Nightly" and "nightly" one unique name; utf8mb4_bin still makes "a"
    equal "a " (PAD SPACE). The no-pad binary one is named differently on
    each server."""
    return "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"


def table_options(dialect: Dialect) -> dict[str, Any]:
    """The options of a table created on ``dialect`` (none off MySQL)."""
    if not is_mysql(dialect):
        return {}
    return _prefixed({**_MYSQL_TABLE_OPTIONS, "collate": binary_collation(dialect)})


def database_clock(dialect: Dialect) -> ColumnElement[Any] | None:
    """The database's clock as naive UTC, comparable with the stored
    instants, read when the statement runs; ``None`` on SQLite, which has no
    clock of its own (the process clock stands in for it)."""
    if is_mysql(dialect):
        return func.utc_timestamp(6)
    if dialect.name == "postgresql":
        return func.timezone("UTC", func.statement_timestamp())
    return None


def is_mysql(on: Engine | Connection | Dialect) -> bool:
    """True for a MySQL or MariaDB engine, dialect or connection."""
    dialect = getattr(on, "dialect", on)
    return getattr(dialect, "name", None) in MYSQL_FAMILY


# Partial indexes exist on PostgreSQL and SQLite only; on MySQL/MariaDB each
# becomes a composite index led by the column its predicate tests, so the
# query still reads only the rows in that state (open runs, retries, skips)
# instead of the whole run history: a plain index on ``deadline_at`` would
# walk every finished run whose deadline has passed. ``None``: not created
# (the due index, ordered by ``next_run_at`` then the primary key, serves
# ``next_run_at IS NULL ORDER BY id`` itself). The due index stays on
# ``next_run_at``: the due-query is a range scan of it up to now.
MYSQL_INDEX_COLUMNS: dict[str, list[str] | None] = {
    "ix_routines_unscheduled": None,
    "ix_routine_runs_open": ["routine_id", "state"],
    "ix_routine_runs_retry_due": ["state", "retry_at"],
    "ix_routine_runs_deadline": ["state", "deadline_at"],
    "ix_routine_runs_skipped_created": ["state", "created_at", "scheduled_for", "attempt"],
}
