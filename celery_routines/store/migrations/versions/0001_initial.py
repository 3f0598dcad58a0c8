"""The routines and routine_runs tables.

Revision ID: 0001_initial
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_routines.store.dialects import table_options
from celery_routines.store.migrations.indexes import create_index, text_default
from celery_routines.store.types import Seconds, UTCDateTime

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

ENABLED_NOT_PAUSED = sa.text("enabled AND NOT paused")
UNSCHEDULED = sa.text("next_run_at IS NULL")
OPEN = sa.text("state IN ('pending', 'sent', 'running')")
RETRYING = sa.text("state = 'retrying'")


def upgrade() -> None:
    op.create_table(
        "routines",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("task", sa.String(255), nullable=False),
        sa.Column("cron", sa.String(255), nullable=True),
        sa.Column("interval_seconds", Seconds, nullable=True),
        sa.Column("timezone", sa.String(64), nullable=True),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.text("true")),
        sa.Column("args", sa.Text(), nullable=False, server_default=text_default("'[]'")),
        sa.Column("kwargs", sa.Text(), nullable=False, server_default=text_default("'{}'")),
        sa.Column("options", sa.Text(), nullable=False, server_default=text_default("'{}'")),
        sa.Column("catch_up", sa.String(16), nullable=False, server_default=sa.text("'catch_up'")),
        sa.Column("catch_up_cap", sa.Integer(), nullable=False, server_default=sa.text("25")),
        sa.Column("max_lateness", Seconds, nullable=True),
        sa.Column("overlap", sa.String(16), nullable=False, server_default=sa.text("'skip'")),
        sa.Column("max_retries", sa.Integer(), nullable=False, server_default=sa.text("4")),
        sa.Column("retry_base_seconds", Seconds, nullable=False, server_default=sa.text("60")),
        sa.Column("ceiling", sa.Text(), nullable=True),
        sa.Column("next_run_at", UTCDateTime(), nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("suspended_until", UTCDateTime(), nullable=True),
        sa.Column("suspended_reason", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("locked_by", sa.String(100), nullable=True),
        sa.Column("locked_until", UTCDateTime(), nullable=True),
        sa.Column("source", sa.String(16), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=True),
        **table_options(op.get_bind().dialect),
    )
    create_index("ix_routines_due", "routines", ["next_run_at"], ENABLED_NOT_PAUSED)
    create_index("ix_routines_unscheduled", "routines", ["id"], UNSCHEDULED)
    op.create_table(
        "routine_runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column(
            "routine_id",
            sa.Integer(),
            sa.ForeignKey("routines.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("idempotency_key", sa.String(500), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default=sa.text("1")),
        sa.Column("scheduled_for", UTCDateTime(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("retry_at", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime(), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("spend", sa.Text(), nullable=True),
        sa.Column("skipped_count", sa.Integer(), nullable=True),
        sa.Column("skipped_first", UTCDateTime(), nullable=True),
        sa.Column("skipped_last", UTCDateTime(), nullable=True),
        sa.UniqueConstraint(
            "routine_id", "idempotency_key", "attempt", name="uq_routine_runs_window_attempt"
        ),
        **table_options(op.get_bind().dialect),
    )
    op.create_index("ix_routine_runs_routine_created", "routine_runs", ["routine_id", "created_at"])
    create_index("ix_routine_runs_open", "routine_runs", ["routine_id"], OPEN)
    create_index("ix_routine_runs_retry_due", "routine_runs", ["retry_at"], RETRYING)


def downgrade() -> None:
    op.drop_table("routine_runs")
    op.drop_table("routines")
