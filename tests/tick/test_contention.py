"""A beat whose due routines are all held by other beats' open claims (SKIP
LOCKED) waits, doubling up to a fraction of a second, instead of retrying
every 5 ms; when the holder dies before committing, the rows are taken at the
next wake and their windows fire once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

from sqlalchemy import create_engine, text

from celery_routines import Scheduler
from celery_routines.beat import WAKE_SLACK
from celery_routines.tick.contention import FIRST_WAIT, LONGEST_WAIT, HeldElsewhere
from tests.conftest import FakeClock
from tests.harness import filesystem_app, insert_routine, published

NOON = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_the_wait_doubles_while_claims_are_refused_and_resets_after() -> None:
    held = HeldElsewhere()
    due = NOON - timedelta(seconds=1)
    waits = [
        (held.retry_at(due, NOON, 0, NOON) - NOON).total_seconds()  # type: ignore[operator]
        for _ in range(10)
    ]
    assert waits[0] == FIRST_WAIT
    assert all(b == min(2 * a, LONGEST_WAIT) for a, b in pairwise(waits))
    assert waits[-1] == LONGEST_WAIT
    assert held.retry_at(due, NOON, 3, NOON) is None  # it claimed some: not refused
    assert held.retry_at(due, NOON, 0, NOON) == NOON + timedelta(seconds=FIRST_WAIT)


def test_a_window_that_fell_due_after_the_claim_or_no_claim_is_not_a_refusal() -> None:
    held = HeldElsewhere()
    assert held.retry_at(NOON + timedelta(milliseconds=3), NOON, 0, NOON) is None
    assert held.retry_at(NOON, None, 0, NOON) is None
    assert held.retry_at(None, NOON, 0, NOON) is None


def test_a_beat_refused_by_another_beats_open_claim_waits_then_takes_over_when_it_dies(
    postgres_url: str, tmp_path: Path
) -> None:
    clock = FakeClock(NOON)
    folder = tmp_path / "broker"
    scheduler = Scheduler(filesystem_app(folder, postgres_url), clock=clock)
    other = create_engine(postgres_url)
    try:
        insert_routine(
            scheduler.store, "hourly", cron="0 * * * *", next_run_at=NOON.replace(hour=13)
        )
        scheduler.tick()  # baselines the row; nothing is due yet
        clock.now = NOON.replace(hour=13)
        # Another beat's claim transaction: the row locked, nothing committed.
        holder = other.connect()
        holder.begin()
        holder.execute(text("SELECT id FROM routines WHERE name = 'hourly' FOR UPDATE"))
        sleeps = [scheduler.tick() for _ in range(8)]
        assert published(folder) == []
        assert sleeps[0] >= FIRST_WAIT  # not the 5 ms retry of a busy loop
        assert sleeps == sorted(sleeps) and sleeps[-1] <= LONGEST_WAIT + WAKE_SLACK
        assert sleeps[-1] > sleeps[0] * 8
        holder.rollback()  # the other beat died before committing
        holder.close()
        scheduler.tick()
        assert [m["routine_window"] for m in published(folder)] == [
            "hourly@2026-11-30T13:00:00+00:00"
        ]
        assert scheduler.engine.held_elsewhere.wait == 0.0
    finally:
        scheduler.close()
        other.dispose()
