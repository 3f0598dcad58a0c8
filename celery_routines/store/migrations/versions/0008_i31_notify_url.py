"""A routine's own notification endpoint (issue 31): ``routines.notify_url``.

NULL (every existing row): the routine's notifications go to the
``routines_notify_url`` setting. Not part of the schedule fingerprint: where
a person is told changes no window, so the upgrade reschedules nothing.

Revision ID: 0008_i31_notify_url
Revises: 0007_i34_calendars
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_i31_notify_url"
down_revision = "0007_i34_calendars"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("routines", sa.Column("notify_url", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("routines") as batch:
        batch.drop_column("notify_url")
