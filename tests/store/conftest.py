from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from celery_routines.store import Store
from celery_routines.store.dialects import is_mysql

HISTORY_START = datetime(2026, 10, 1, tzinfo=UTC)
HISTORY_STEP = timedelta(minutes=20)
HISTORY_ROUTINES = 20
HISTORY_RUNS = 2000  # about four weeks, through the end of October 2026
HISTORY_SKIP_EVERY = 50


@pytest.fixture
def run_history(store: Store) -> Store:
    """The store with a run history the planner has statistics for.

    A query plan read on empty, never analysed tables is the planner breaking
    ties, not what it does with data: with several indexes on ``created_at``
    it may pick any of them. Runs are spread over the routines in turn, one
    every ``HISTORY_STEP``; every ``HISTORY_SKIP_EVERY``-th is ``skipped``.
    """
    with store.engine.begin() as conn:
        conn.execute(
            text("INSERT INTO routines (name, task, interval_seconds) VALUES (:n, 't', 60)"),
            [{"n": f"history-{i}"} for i in range(HISTORY_ROUTINES)],
        )
        ids = conn.execute(text("SELECT id FROM routines ORDER BY id")).scalars().all()
        conn.execute(
            text(
                "INSERT INTO routine_runs (id, routine_id, idempotency_key, attempt, "
                "scheduled_for, state, created_at) VALUES (:id, :rid, :key, 1, :at, :state, :at)"
            ),
            [
                {
                    "id": f"history-{i}",
                    "rid": ids[i % len(ids)],
                    "key": f"history@{i}",
                    "at": (HISTORY_START + i * HISTORY_STEP).replace(tzinfo=None),
                    "state": "skipped" if i % HISTORY_SKIP_EVERY == 0 else "succeeded",
                }
                for i in range(HISTORY_RUNS)
            ],
        )
    with store.engine.begin() as conn:
        if is_mysql(store.engine):
            conn.execute(text("ANALYZE TABLE routines, routine_runs"))
        else:
            conn.execute(text("ANALYZE"))
    return store
