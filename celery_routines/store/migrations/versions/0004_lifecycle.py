"""Routine lifecycle: owners and retirement, schedule fingerprints, the change log.

- ``routines.owner``: the app (``routines_owner``, else the Celery app's
  ``main``) whose code declared a ``source = 'code'`` routine; only that
  owner retires it.
- ``routines.declared_version``: the declaration stamp of the code that last
  wrote the routine; an older stamp never overwrites, retires or revives
  (a rolling deploy never flip-flops).
- ``routines.retired_at``: set while a code routine is no longer declared by
  its owner; such a routine is never fired.
- ``routines.schedule_fingerprint``: the schedule (cron, interval, timezone,
  enabled) ``next_run_at`` was computed from, as the database spells it; a row
  whose columns no longer match was edited outside beat.
- ``routine_changes``: who changed which routine, when, and how.

Pruning reads ``ix_routine_runs_created`` (oldest first) and
``ix_routine_runs_routine_created`` (the newest run per routine): no new index.

Revision ID: 0004_lifecycle
Revises: 0003_run_listing_indexes
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_routines.store.dialects import table_options
from celery_routines.store.types import UTCDateTime

revision = "0004_lifecycle"
down_revision = "0003_run_listing_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("routines", sa.Column("owner", sa.String(200), nullable=True))
    op.add_column("routines", sa.Column("declared_version", sa.String(100), nullable=True))
    op.add_column("routines", sa.Column("retired_at", UTCDateTime(), nullable=True))
    op.add_column("routines", sa.Column("schedule_fingerprint", sa.String(400), nullable=True))
    op.create_table(
        "routine_changes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("routine", sa.String(200), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("changed_by", sa.String(255), nullable=True),
        sa.Column("changed_at", UTCDateTime(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        **table_options(op.get_bind().dialect),
    )
    op.create_index("ix_routine_changes_routine", "routine_changes", ["routine", "id"])


def downgrade() -> None:
    op.drop_index("ix_routine_changes_routine", table_name="routine_changes")
    op.drop_table("routine_changes")
    with op.batch_alter_table("routines") as batch:
        batch.drop_column("schedule_fingerprint")
        batch.drop_column("retired_at")
        batch.drop_column("declared_version")
        batch.drop_column("owner")
