"""Consecutive final failures, counted from the run rows on every store: a
success ends a streak, an attempt that was retried is not a final failure,
``resume`` starts the count afresh, and only one caller pauses."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert

from celery_routines.config import Settings
from celery_routines.observe.final_failures import after_final_failure
from celery_routines.operator.admin import Routines
from celery_routines.store import Store
from celery_routines.store.models import ROUTINE_RUNS
from tests.conftest import FakeClock
from tests.harness import insert_routine

T0 = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)


def finished(store: Store, routine_id: int, minute: int, state: str, attempt: int = 1,
             key: str | None = None) -> None:  # fmt: skip
    at = T0 + timedelta(minutes=minute)
    with store.engine.begin() as conn:
        conn.execute(
            insert(ROUTINE_RUNS).values(
                id=str(uuid.uuid4()), routine_id=routine_id, attempt=attempt, state=state,
                idempotency_key=key or f"r@{at.isoformat()}", scheduled_for=at,
                created_at=at, finished_at=at + timedelta(seconds=5),
            )
        )  # fmt: skip


def test_a_streak_counts_final_failures_since_the_last_success(store: Store) -> None:
    routine_id = insert_routine(store, "r", interval_seconds=60, pause_after_failures=3)
    finished(store, routine_id, 0, "failed")
    finished(store, routine_id, 1, "succeeded")  # ends the streak before it
    finished(store, routine_id, 2, "lost")
    finished(store, routine_id, 3, "failed", attempt=1, key="r@retried")  # retried later...
    finished(store, routine_id, 4, "failed", attempt=2, key="r@retried")  # ...final here
    finished(store, routine_id, 5, "skipped")  # a skip is not a failure
    lost_key = f"r@{(T0 + timedelta(minutes=2)).isoformat()}"
    streak = store.streaks.streak(routine_id)
    assert (streak.count, streak.failures) == (2, [("r@retried", "failed"), (lost_key, "lost")])


def test_the_nth_final_failure_pauses_once_with_its_reason_and_resume_clears_it(
    store: Store, database_url: str, clock: FakeClock
) -> None:
    routine_id = insert_routine(store, "r", interval_seconds=60, pause_after_failures=2)

    def fail(minute: int) -> bool:
        finished(store, routine_id, minute, "failed")
        return after_final_failure(
            store, routine_id=routine_id, routine="r", pause_after=2, run_id=f"run{minute}",
            window=None, state="failed", error="boom", now=T0 + timedelta(minutes=minute),
            notifier=None,
        )  # fmt: skip

    assert fail(0) is False
    assert fail(1) is True
    record = store.routines.by_name("r")
    assert record.paused and record.paused_reason.startswith(
        "paused after 2 consecutive final failures (pause_after_failures=2): r@"
    )
    assert fail(2) is False  # already paused: paused once
    clock.now = T0 + timedelta(minutes=10)
    Routines(Settings(database_url=database_url), store=store, clock=clock).resume("r")
    record = store.routines.by_name("r")
    assert (record.paused, record.paused_reason) == (False, None)
    assert fail(11) is False  # the count starts again after a resume
    assert fail(12) is True
