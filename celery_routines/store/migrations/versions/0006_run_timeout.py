"""A routine's own run timeout, and what run metrics read (issue 18).

- ``routines.run_timeout``: seconds without a heartbeat before a run of this
  routine is declared lost; NULL (every existing row) keeps the configured
  ``routines_run_timeout``.
- ``ix_routine_runs_finished``: beat's run metrics read the runs finished
  since their last read, a range scan of this index.
- ``routine_worker_events``: what workers did that no run column dates (a
  refused duplicate delivery, an after-run suspension), append-only, read by
  id past the last one seen.

Revision ID: 0006_run_timeout
Revises: 0004_lifecycle
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_routines.store.dialects import table_options
from celery_routines.store.types import Seconds, UTCDateTime

revision = "0006_run_timeout"
down_revision = "0004_lifecycle"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("routines", sa.Column("run_timeout", Seconds, nullable=True))
    op.create_index("ix_routine_runs_finished", "routine_runs", ["finished_at"])
    op.create_table(
        "routine_worker_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("routine_id", sa.Integer(), nullable=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        **table_options(op.get_bind().dialect),
    )


def downgrade() -> None:
    op.drop_table("routine_worker_events")
    op.drop_index("ix_routine_runs_finished", table_name="routine_runs")
    with op.batch_alter_table("routines") as batch:
        batch.drop_column("run_timeout")
