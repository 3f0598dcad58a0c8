"""Schedule kinds and bounds: one-off ``at``, ``solar``, ``starts_at``,
``ends_at`` and ``jitter_seconds`` on ``routines`` (issue 16).

All nullable: existing rows keep their cron or interval and stay unbounded.

Revision ID: 0005_schedule_types
Revises: 0004_lifecycle
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_routines.store.types import UTCDateTime

revision = "0005_schedule_types"
# Chained after lifecycle (issue 13) once that branch was merged in; the
# revision was written against 0003_run_listing_indexes.
down_revision = "0004_lifecycle"
branch_labels = None
depends_on = None

COLUMNS = ("at", "solar", "starts_at", "ends_at", "jitter_seconds")


def upgrade() -> None:
    op.add_column("routines", sa.Column("at", UTCDateTime(), nullable=True))
    op.add_column("routines", sa.Column("solar", sa.String(100), nullable=True))
    op.add_column("routines", sa.Column("starts_at", UTCDateTime(), nullable=True))
    op.add_column("routines", sa.Column("ends_at", UTCDateTime(), nullable=True))
    op.add_column("routines", sa.Column("jitter_seconds", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("routines") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
