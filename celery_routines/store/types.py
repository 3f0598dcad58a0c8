"""Column types shared by the models."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Float
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from .dialects import MYSQL_FAMILY, is_mysql

# Seconds (intervals, lateness, retry base). MySQL's FLOAT is single
# precision: 0.1 would read back as 0.10000000149, and a definition compared
# with its stored copy would look changed at every start.
Seconds = Float().with_variant(mysql.DOUBLE(asdecimal=False), *sorted(MYSQL_FAMILY))


class UTCDateTime(TypeDecorator[datetime]):
    """An instant stored as naive UTC and read back as aware UTC.

    SQLite drops the offset of ``DateTime(timezone=True)`` and then compares
    strings, so 02:30+01:00 and 02:30+02:00 would collide; storing naive UTC
    everywhere keeps range queries right on every backend. MySQL's TIMESTAMP
    would convert through the session's time zone and ends in 2038: a naive
    ``DATETIME(6)`` holding UTC is the same thing as elsewhere.
    """

    impl = DateTime(timezone=False)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if is_mysql(dialect):
            # DATETIME alone keeps whole seconds; windows and claims need
            # microseconds, like PostgreSQL's timestamp.
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(self.impl)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given where an aware instant is needed")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(
        self, value: datetime | str | None, dialect: Dialect
    ) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        return value.replace(tzinfo=UTC)
