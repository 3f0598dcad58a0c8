"""Issue 5, scenario 9: hot-loop guards.

A routine whose task always fails and one whose send always fails (an
unreachable broker) each produce at most the attempts their policy allows in
an hour: count the rows. Beat is driven as ``celery beat`` drives it: it
sleeps what ``tick()`` returns (capped by ``beat_max_loop_interval``, 5 s
here), with an injected clock, so an hour takes a few seconds and a hot loop
shows up as a tick count, not as a hung test.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from celery_routines import Scheduler, register
from celery_routines.store import Store
from celery_routines.worker import outcomes
from tests.conftest import FakeClock
from tests.harness import filesystem_app, insert_routine, runs_for, runs_of

MAX_INTERVAL = 5
# Up to and including the 13:00 window.
HOUR = timedelta(hours=1, seconds=MAX_INTERVAL)
# An hour of ticks at most every 5 s, plus the ones a due instant adds.
TICK_BUDGET = 3600 // MAX_INTERVAL * 2


def fail_every_sent_run(store: Store, now: datetime) -> int:
    """What a worker does with a task whose body always raises."""
    with store.engine.connect() as conn:
        ids = conn.execute(text("SELECT id FROM routine_runs WHERE state = 'sent'")).scalars()
        ids = list(ids)
    for run_id in ids:
        assert store.outcomes.claim_start(run_id, "worker-1", now)
        outcomes.record_failure(store, run_id, "RuntimeError: always fails", now, lost=False)
    return len(ids)


def run_beat_for(scheduler: Scheduler, clock: FakeClock, span: timedelta, after_tick=None) -> int:
    """Tick, then sleep what the tick asked for, until ``span`` has passed; the
    number of ticks. Fails on a tick that asks for no sleep at all."""
    end = clock.now + span
    ticks = 0
    while clock.now < end:
        sleep = scheduler.tick()
        ticks += 1
        assert 0 < sleep <= MAX_INTERVAL, sleep
        assert ticks <= TICK_BUDGET, f"hot loop: {ticks} ticks by {clock.now}"
        if after_tick is not None:
            after_tick(clock.now)
        clock.advance(seconds=sleep)
    return ticks


def attempts_per_window(store: Store, name: str) -> Counter[str]:
    return Counter(r["idempotency_key"] for r in runs_of(store, name) if r["state"] != "skipped")


def test_a_task_that_always_fails_makes_at_most_its_retries_per_window(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    # Every 10 minutes; attempt N+1 after 1, 2, 4, 8 minutes: five attempts a window.
    register("tasks.doomed", timedelta(minutes=10), name="doomed")
    app = filesystem_app(tmp_path / "broker", database_url, beat_max_loop_interval=MAX_INTERVAL)
    scheduler = Scheduler(app, clock=clock)
    try:
        store = scheduler.store
        ticks = run_beat_for(
            scheduler, clock, HOUR, after_tick=lambda now: fail_every_sent_run(store, now)
        )
        per_window = attempts_per_window(store, "doomed")
        assert len(per_window) == 6  # 12:10 .. 13:00
        assert max(per_window.values()) <= 5
        assert sum(per_window.values()) <= 6 * 5
        # The windows of the first 45 minutes used all five attempts, no more.
        early = [key for key in per_window if key < "doomed@2026-11-30T12:45"]
        assert all(per_window[key] == 5 for key in early), per_window
        record = store.routines.by_name("doomed")
        first = sorted(
            (
                r
                for r in runs_for(store, record.id)
                if r.idempotency_key == "doomed@2026-11-30T12:10:00+00:00"
            ),
            key=lambda r: r.attempt,
        )
        gaps = [
            round((b.created_at - a.created_at).total_seconds() / 60)
            for a, b in itertools.pairwise(first)
        ]
        assert gaps == [1, 2, 4, 8]
        assert ticks <= TICK_BUDGET
    finally:
        scheduler.close()


def test_a_send_that_always_fails_makes_at_most_its_retries_per_window(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    # No kombu publish retries (about a second of real sleep per send; and
    # retry=False waits 6 s): our attempts are counted here, not kombu's.
    register(
        "tasks.unsendable",
        timedelta(minutes=10),
        name="unsendable",
        options={"retry_policy": {"max_retries": 0}},
    )
    app = filesystem_app(tmp_path / "broker", database_url, beat_max_loop_interval=MAX_INTERVAL)
    # A broker nobody listens on: every publish fails.
    app.conf.update(
        broker_url="redis://127.0.0.1:1/0",
        broker_connection_retry=False,
        broker_connection_max_retries=0,
    )
    scheduler = Scheduler(app, clock=clock)
    try:
        store = scheduler.store
        ticks = run_beat_for(scheduler, clock, HOUR)
        per_window = attempts_per_window(store, "unsendable")
        assert len(per_window) == 6  # the cadence advanced through the outage
        assert max(per_window.values()) <= 5
        assert sum(per_window.values()) <= 30
        rows = runs_of(store, "unsendable")
        assert all(r["reason"] == "send_failed" and r["error"] for r in rows), rows
        assert all("onnect" in r["error"] or "refused" in r["error"] for r in rows), rows[0]
        assert store.routines.by_name("unsendable").next_run_at == datetime(
            2026, 11, 30, 13, 10, tzinfo=UTC
        )
        assert ticks <= TICK_BUDGET
    finally:
        scheduler.close()


@pytest.mark.parametrize(
    ("columns", "fragment"),
    [
        ({"retry_base_seconds": 0.0, "max_retries": 100}, "retry_base_seconds"),
        ({"retry_base_seconds": -60.0}, "-60"),
        ({"max_retries": 1_000_000}, "1000000"),
        ({"max_retries": -1}, "-1"),
    ],
)
def test_a_sql_row_with_a_retry_policy_that_would_hot_loop_is_marked_invalid(
    database_url: str, tmp_path: Path, clock: FakeClock, columns: dict, fragment: str
) -> None:
    """The declaration door refuses these (tests/test_registry.py); a row
    typed in by hand must not retry once per tick instead."""
    app = filesystem_app(tmp_path / "broker", database_url, beat_max_loop_interval=MAX_INTERVAL)
    scheduler = Scheduler(app, clock=clock)
    try:
        store = scheduler.store
        insert_routine(store, "hand-typed", interval_seconds=60.0, **columns)
        run_beat_for(
            scheduler,
            clock,
            timedelta(minutes=10),
            after_tick=lambda now: fail_every_sent_run(store, now),
        )
        record = store.routines.by_name("hand-typed")
        assert record.last_error is not None
        assert "'hand-typed'" in record.last_error and fragment in record.last_error
        assert runs_of(store, "hand-typed") == []
    finally:
        scheduler.close()
