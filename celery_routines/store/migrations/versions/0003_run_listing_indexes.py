"""Indexes for the run listings across routines (``celery routines runs``/``skips``).

Both listings order by ``created_at DESC, scheduled_for DESC, attempt DESC``
with no routine filter, which ``ix_routine_runs_routine_created`` cannot serve:
without these they scan and sort the whole run history. Each index carries
the whole order, so the listing is a backward range scan that stops at its
limit. The skips listing (``state = 'skipped'``) gets a partial index: skips
are a small share of the runs, and walking the full index for them would read
the runs in between.

Revision ID: 0003_run_listing_indexes
Revises: 0002_run_lifecycle
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from celery_routines.store.migrations.indexes import create_index

revision = "0003_run_listing_indexes"
down_revision = "0002_run_lifecycle"
branch_labels = None
depends_on = None

LISTING_ORDER = ["created_at", "scheduled_for", "attempt"]
SKIPPED = sa.text("state = 'skipped'")


def upgrade() -> None:
    op.create_index("ix_routine_runs_created", "routine_runs", LISTING_ORDER)
    create_index("ix_routine_runs_skipped_created", "routine_runs", LISTING_ORDER, SKIPPED)


def downgrade() -> None:
    op.drop_index("ix_routine_runs_skipped_created", table_name="routine_runs")
    op.drop_index("ix_routine_runs_created", table_name="routine_runs")
