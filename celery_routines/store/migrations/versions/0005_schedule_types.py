"""Schedule kinds and bounds: one-off ``at``, ``solar``, ``rrule``, ``starts_at``,
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

COLUMNS = ("at", "solar", "rrule", "starts_at", "ends_at", "jitter_seconds")


def upgrade() -> None:
    op.add_column("routines", sa.Column("at", UTCDateTime(), nullable=True))
    op.add_column("routines", sa.Column("solar", sa.String(100), nullable=True))
    op.add_column("routines", sa.Column("rrule", sa.Text(), nullable=True))
    op.add_column("routines", sa.Column("starts_at", UTCDateTime(), nullable=True))
    op.add_column("routines", sa.Column("ends_at", UTCDateTime(), nullable=True))
    op.add_column("routines", sa.Column("jitter_seconds", sa.Integer(), nullable=True))
    # The fingerprint now spells these columns too (an rrule is free text).
    # Not on SQLite: it does not enforce the length, and rebuilding the table
    # there (batch mode) would drop it, cascading to every run of every routine.
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column(
            "routines", "schedule_fingerprint", type_=sa.Text(), existing_type=sa.String(400)
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column(
            "routines", "schedule_fingerprint", type_=sa.String(400), existing_type=sa.Text()
        )
    for name in reversed(COLUMNS):
        op.drop_column("routines", name)
