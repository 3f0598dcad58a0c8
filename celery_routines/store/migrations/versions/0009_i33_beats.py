"""The beats' heartbeats (issue 33): ``routine_beats``, one row per beat
process, upserted by the beat at most once every few seconds and read by the
panel's Beats page and ``GET /api/beats``. A new table: no existing row
changes, the upgrade reschedules nothing.

Revision ID: 0009_i33_beats
Revises: 0008_i31_notify_url
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_routines.store.dialects import table_options
from celery_routines.store.types import Seconds, UTCDateTime

revision = "0009_i33_beats"
down_revision = "0008_i31_notify_url"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "routine_beats",
        sa.Column("beat_id", sa.String(100), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("last_tick_at", UTCDateTime(), nullable=False),
        sa.Column("beat_clock_at", UTCDateTime(), nullable=False),
        sa.Column("tick_p50_ms", Seconds, nullable=True),
        sa.Column("tick_p99_ms", Seconds, nullable=True),
        sa.Column("ticks_measured", sa.Integer(), nullable=False),
        sa.Column("claims_held", sa.Integer(), nullable=False),
        sa.Column("publish_processes", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("stale_after_seconds", Seconds, nullable=False),
        **table_options(op.get_bind().dialect),
    )
    op.create_index("ix_routine_beats_last_tick", "routine_beats", ["last_tick_at"])


def downgrade() -> None:
    op.drop_index("ix_routine_beats_last_tick", table_name="routine_beats")
    op.drop_table("routine_beats")
