"""Statements compiled once to the driver's own SQL, for the worker's hot path.

A worker's claim and outcome are one-row UPDATEs that PostgreSQL runs in well
under a millisecond; preparing each execution through SQLAlchemy (cache key,
compiled-cache lookup, parameter processing) cost about as much again. These
are compiled once and run with ``exec_driver_sql``.

What that skips is the column types' bind processing: callers pass values the
driver takes as they are (naive UTC datetimes, see :func:`naive_utc`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, CursorResult
from sqlalchemy.engine import Dialect

from .types import UTCDateTime

_UTC_DATETIME = UTCDateTime()


@dataclass(frozen=True)
class DriverStatement:
    sql: str
    # The literal values the statement carries ('running', 'UTC', ...).
    defaults: Mapping[str, Any]

    @classmethod
    def compile(cls, statement: Any, dialect: Dialect) -> DriverStatement:
        compiled = statement.compile(dialect=dialect)
        sql = str(compiled)
        if "POSTCOMPILE" in sql or compiled.positional:
            # An expanding IN or a positional driver cannot be run as a fixed string.
            raise ValueError(f"cannot compile once for the driver: {sql}")
        return cls(sql, dict(compiled.params))

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> CursorResult[Any]:
        return conn.exec_driver_sql(self.sql, {**self.defaults, **params})


def naive_utc(instant: datetime | None) -> datetime | None:
    """What ``UTCDateTime`` stores, for a statement that bypasses the column type."""
    return _UTC_DATETIME.process_bind_param(instant, None)  # type: ignore[arg-type]
