"""Schema migrations shipped in the package and applied at beat start-up.

Alembic (and Mako under it) is imported only when a migration is due: a beat
starting on an up-to-date schema checks the version with one plain SELECT,
which keeps about 10 MB of imports out of every beat process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from .dialects import is_mysql
from .migrations.env_settings import VERSION_TABLE

logger = logging.getLogger("celery_routines.store")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# The newest revision shipped; tests/store checks it against the scripts.
HEAD_REVISION = "0003_run_listing_indexes"
# Any constant works; it only has to be the same for every beat.
PG_MIGRATION_LOCK = 0x726F7574
# MySQL/MariaDB: a named lock of the server, held by the migrating connection.
MYSQL_MIGRATION_LOCK = "celery_routines.migrate"
# A beat waiting on another's migration gives up after this long, with an error.
MYSQL_LOCK_WAIT_SECONDS = 300


def _alembic_config() -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    """The newest revision among the shipped scripts (reads them with Alembic)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    return head or "base"


def current_revision(engine: Engine) -> str | None:
    """The schema's revision, or None for a database never migrated."""
    try:
        with engine.connect() as connection:
            return connection.execute(
                text(f"SELECT version_num FROM {VERSION_TABLE}")
            ).scalar_one_or_none()
    except DBAPIError:
        return None  # no version table yet


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest revision; safe when several beats start at once."""
    if current_revision(engine) == HEAD_REVISION:
        return
    from alembic import command

    config = _alembic_config()
    if is_mysql(engine):
        _upgrade_mysql(engine, config)
        logger.info("celery-routines schema migrated to %s", HEAD_REVISION)
        return
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Serialise concurrent start-ups; released at commit.
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK})
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    logger.info("celery-routines schema migrated to %s", HEAD_REVISION)


def _upgrade_mysql(engine: Engine, config: Any) -> None:
    """MySQL commits at every DDL statement, so a lock tied to a transaction
    would end at the first CREATE TABLE: ``GET_LOCK`` belongs to the
    connection and lasts until ``RELEASE_LOCK``. It is taken outside any
    transaction, so Alembic reads the version table only after the beat that
    migrated first has finished: it then finds the head and does nothing."""
    from alembic import command

    with engine.connect() as connection:
        got = connection.execute(
            text("SELECT GET_LOCK(:name, :wait)"),
            {"name": MYSQL_MIGRATION_LOCK, "wait": MYSQL_LOCK_WAIT_SECONDS},
        ).scalar()
        connection.commit()
        if got != 1:
            raise TimeoutError(
                f"waited {MYSQL_LOCK_WAIT_SECONDS} s for the migration lock "
                f"{MYSQL_MIGRATION_LOCK!r} held by another process; is a migration stuck?"
            )
        try:
            with connection.begin():
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
        finally:
            connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": MYSQL_MIGRATION_LOCK})
            connection.commit()
