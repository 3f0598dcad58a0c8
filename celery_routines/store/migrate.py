"""Schema migrations shipped in the package and applied at beat start-up.

Alembic (and Mako under it) is imported only when a migration is due: a beat
starting on an up-to-date schema checks the version with one plain SELECT,
which keeps about 10 MB of imports out of every beat process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from .dialects import is_mysql
from .migrations.env_settings import VERSION_TABLE

if TYPE_CHECKING:
    # Only named here: the functions import Alembic where they use it.
    from alembic.config import Config
    from alembic.runtime.migration import MigrationInfo

logger = logging.getLogger("celery_routines.store")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# The newest revision shipped; tests/store checks it against the scripts.
HEAD_REVISION = "0009_i33_beats"
# Any constant works; it only has to be the same for every beat.
PG_MIGRATION_LOCK = 0x726F7574
# MySQL/MariaDB: a named lock of the server, held by the migrating connection.
MYSQL_MIGRATION_LOCK = "celery_routines.migrate"
# A beat waiting on another's migration gives up after this long, with an error.
MYSQL_LOCK_WAIT_SECONDS = 300


def _alembic_config() -> Config:
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
    # Connecting is outside the try: a server that is down or a database that
    # does not exist must fail here, with its own error, not pass for "never
    # migrated" and fail again inside Alembic.
    with engine.connect() as connection:
        try:
            return connection.execute(
                text(f"SELECT version_num FROM {VERSION_TABLE}")
            ).scalar_one_or_none()
        except DBAPIError:
            return None  # no version table yet


def has_schema(engine: Engine) -> bool:
    """Whether the store has its tables (at any revision), without creating
    anything: a SQLite file that does not exist (or is empty) is not opened,
    since connecting would create it."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        path = url.database or ""
        on_disk = path not in ("", ":memory:") and not path.startswith("file:")
        if on_disk and (not os.path.exists(path) or os.path.getsize(path) == 0):
            return False
    return current_revision(engine) is not None


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest revision; safe when several beats start at once."""
    if current_revision(engine) == HEAD_REVISION:
        return
    with _quiet_alembic():
        from alembic import command

        config = _alembic_config()
        # env.py calls this once per revision applied: our one line each.
        config.attributes["on_version_apply"] = _log_applied
        if is_mysql(engine):
            _upgrade_mysql(engine, config)
            return
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                # Serialise concurrent start-ups; released at commit.
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK}
                )
            config.attributes["connection"] = connection
            command.upgrade(config, "head")


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Alembic logs nine lines at INFO on a first start (its plugins, its
    DDL mode, each step); the user needs one line per revision applied,
    which :func:`_log_applied` writes. Its warnings and errors still show."""
    alembic_logger = logging.getLogger("alembic")
    level = alembic_logger.level
    alembic_logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        alembic_logger.setLevel(level)


def _log_applied(*, step: MigrationInfo, **_: object) -> None:
    revision = getattr(step, "up_revision", None)
    doc = " ".join(str(getattr(revision, "doc", "") or "").replace("``", "").split())
    logger.info(
        "celery-routines schema: applied migration %s%s",
        step.up_revision_id,
        f" ({doc.rstrip('.')})" if doc else "",
    )


def _upgrade_mysql(engine: Engine, config: Config) -> None:
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
