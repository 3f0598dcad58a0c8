"""Calendars on ``routines`` (issue 34): ``schedules`` (several specs, a JSON
list), ``exclude`` (dates, ranges, crons, holidays:CC; a JSON list or entries
separated by ';') and ``shift`` (next_business_day / previous_business_day).

All nullable: existing rows keep their schedule, and their stored schedule
fingerprint still matches (the fingerprint spells these columns only when one
is set), so the upgrade reschedules nothing.

Revision ID: 0007_i34_calendars
Revises: 0007_i31_pause_after_failures
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_i34_calendars"
down_revision = "0007_i31_pause_after_failures"
branch_labels = None
depends_on = None

COLUMNS = ("schedules", "exclude", "shift")


def upgrade() -> None:
    op.add_column("routines", sa.Column("schedules", sa.Text(), nullable=True))
    op.add_column("routines", sa.Column("exclude", sa.Text(), nullable=True))
    op.add_column("routines", sa.Column("shift", sa.String(32), nullable=True))


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("routines", name)
