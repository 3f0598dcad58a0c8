"""Alembic environment: runs on the connection handed over by ``migrate.upgrade``."""

from __future__ import annotations

from alembic import context

from celery_routines.store.migrations.env_settings import VERSION_TABLE
from celery_routines.store.models import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only when run through the alembic CLI
    from celery_routines.store.engine import make_engine

    # Ours: no server-side prepared statements (safe behind PgBouncer).
    url = context.config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("alembic.ini: set sqlalchemy.url to the store's database URL")
    engine = make_engine(url)
    connection = engine.connect()

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
    on_version_apply=context.config.attributes.get("on_version_apply"),
)
with context.begin_transaction():
    context.run_migrations()
