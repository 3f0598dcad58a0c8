"""A routine that pauses itself after N consecutive final failures (issue 31).

- ``routines.pause_after_failures``: N; NULL (every existing row): never.
- ``routines.paused_reason``: why an automatic pause happened (the failures
  it counted); cleared by ``resume``.
- ``routines.failures_counted_from``: final failures before this instant do
  not count toward N (``resume`` sets it, so a resumed routine starts afresh).

Revision ID: 0007_i31_pause_after_failures
Revises: 0006_run_timeout
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_routines.store.types import UTCDateTime

revision = "0007_i31_pause_after_failures"
down_revision = "0006_run_timeout"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("routines", sa.Column("pause_after_failures", sa.Integer(), nullable=True))
    op.add_column("routines", sa.Column("paused_reason", sa.Text(), nullable=True))
    op.add_column("routines", sa.Column("failures_counted_from", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("routines") as batch:
        batch.drop_column("failures_counted_from")
        batch.drop_column("paused_reason")
        batch.drop_column("pause_after_failures")
