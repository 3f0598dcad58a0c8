"""Run lifecycle: the lost deadline, duplicate deliveries, Celery's own retries.

Revision ID: 0002_run_lifecycle
Revises: 0001_initial
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_routines.store.types import UTCDateTime

revision = "0002_run_lifecycle"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

OPEN = sa.text("state IN ('pending', 'sent', 'running')")


def upgrade() -> None:
    # An open run not finished by deadline_at is declared lost by beat's sweep.
    op.add_column("routine_runs", sa.Column("deadline_at", UTCDateTime(), nullable=True))
    # Deliveries of the run refused because it had already started or finished.
    op.add_column(
        "routine_runs",
        sa.Column("duplicates", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    # request.retries of the delivery holding the run: Celery's own self.retry()
    # redelivers the same run with a higher count, a duplicate with the same.
    op.add_column(
        "routine_runs",
        sa.Column("celery_retries", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.create_index(
        "ix_routine_runs_deadline",
        "routine_runs",
        ["deadline_at"],
        postgresql_where=OPEN,
        sqlite_where=OPEN,
    )


def downgrade() -> None:
    op.drop_index("ix_routine_runs_deadline", table_name="routine_runs")
    with op.batch_alter_table("routine_runs") as batch:
        batch.drop_column("celery_retries")
        batch.drop_column("duplicates")
        batch.drop_column("deadline_at")
