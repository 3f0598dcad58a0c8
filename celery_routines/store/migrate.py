"""Schema migrations shipped in the package and applied at beat start-up."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

from .migrations.env_settings import VERSION_TABLE

logger = logging.getLogger("celery_routines.store")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Any constant works; it only has to be the same for every beat.
PG_MIGRATION_LOCK = 0x726F7574


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None  # the package always ships at least one revision
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest revision; safe when several beats start at once."""
    if current_revision(engine) == head_revision():
        return
    config = _alembic_config()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Serialise concurrent start-ups; released at commit.
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK})
        config.attributes["connection"] = connection
        before = MigrationContext.configure(
            connection, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()
        command.upgrade(config, "head")
    logger.info("celery-routines schema migrated from %s to %s", before, head_revision())
