"""Index creation shared by the migration scripts."""

from __future__ import annotations

from typing import Any

from alembic import op
from sqlalchemy import TextClause

from celery_routines.store.dialects import MYSQL_INDEX_COLUMNS, is_mysql


def create_index(name: str, table: str, columns: list[str], where: Any = None) -> None:
    """``columns``, partial on ``where`` on PostgreSQL and SQLite; on MySQL
    the composite replacement named in ``MYSQL_INDEX_COLUMNS``, if any."""
    if is_mysql(op.get_bind()):
        replacement = MYSQL_INDEX_COLUMNS.get(name, columns)
        if replacement is not None:
            op.create_index(name, table, replacement)
        return
    if where is None:
        op.create_index(name, table, columns)
    else:
        op.create_index(name, table, columns, postgresql_where=where, sqlite_where=where)


def text_default(literal: str) -> TextClause:
    """A server default for a TEXT column: MySQL 8 accepts one only as an
    expression in parentheses (MariaDB, PostgreSQL and SQLite take both)."""
    import sqlalchemy as sa

    if is_mysql(op.get_bind()):
        return sa.text(f"({literal})")
    return sa.text(literal)
