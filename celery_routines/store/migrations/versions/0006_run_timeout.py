"""A routine's own run timeout (issue 18).

``routines.run_timeout``: seconds without a heartbeat before a run of this
routine is declared lost; NULL (every existing row) keeps the configured
``routines_run_timeout``.

Revision ID: 0006_run_timeout
Revises: 0003_run_listing_indexes
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_routines.store.types import Seconds

revision = "0006_run_timeout"
down_revision = "0003_run_listing_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("routines", sa.Column("run_timeout", Seconds, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("routines") as batch:
        batch.drop_column("run_timeout")
