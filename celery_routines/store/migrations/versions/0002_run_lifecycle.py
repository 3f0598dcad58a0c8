"""Run lifecycle: the lost deadline, duplicate deliveries, Celery's own retries.

Revision ID: 0002_run_lifecycle
Revises: 0001_initial
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from alembic import op

from celery_routines.store.migrations.indexes import create_index
from celery_routines.store.types import UTCDateTime

revision = "0002_run_lifecycle"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

OPEN = sa.text("state IN ('pending', 'sent', 'running')")
# Runs open before this revision get the default routines_run_timeout.
DEFAULT_RUN_TIMEOUT = timedelta(seconds=3600)


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
    _backfill_deadlines()
    create_index("ix_routine_runs_deadline", "routine_runs", ["deadline_at"], OPEN)


def _backfill_deadlines() -> None:
    """Give runs left open by the previous revision a deadline, so the lost
    sweep can find them (in Python: date arithmetic differs per database)."""
    runs = sa.table(
        "routine_runs",
        sa.column("id", sa.String()),
        sa.column("state", sa.String()),
        sa.column("created_at", UTCDateTime()),
        sa.column("sent_at", UTCDateTime()),
        sa.column("started_at", UTCDateTime()),
        sa.column("deadline_at", UTCDateTime()),
    )
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(runs.c.id, runs.c.created_at, runs.c.sent_at, runs.c.started_at).where(
            runs.c.state.in_(("pending", "sent", "running"))
        )
    ).all()
    for row in rows:
        since = row.started_at or row.sent_at or row.created_at
        bind.execute(
            runs.update().where(runs.c.id == row.id).values(deadline_at=since + DEFAULT_RUN_TIMEOUT)
        )


def downgrade() -> None:
    op.drop_index("ix_routine_runs_deadline", table_name="routine_runs")
    with op.batch_alter_table("routine_runs") as batch:
        batch.drop_column("celery_retries")
        batch.drop_column("duplicates")
        batch.drop_column("deadline_at")
