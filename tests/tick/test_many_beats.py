"""Guarantee 2: one window fires once, however many beats run.

Two real Scheduler instances tick the same PostgreSQL database concurrently
(two threads, so their claims truly race) under one injected clock, publishing
to a real Redis broker. Every window must have exactly one run row and one
message, none may be missing, and the routine claim must do the work: the
database's unique key (the last line of defence) is never reached.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import redis
from sqlalchemy import text

from celery_routines import Scheduler, register
from celery_routines.schedules.keys import window_key
from celery_routines.schedules.parse import schedule_from_columns
from celery_routines.tick.report import TickReport
from tests.conftest import FakeClock
from tests.harness import redis_app

ROUTINES = 240
STEPS = 150
STEP = timedelta(seconds=7)


def declare_routines() -> None:
    # No worker runs here, so runs stay sent: overlap="overlap" sends every
    # window anyway (the default "skip" would record overlap skips).
    for i in range(ROUTINES):
        if i % 4 == 0:
            register(
                "tasks.noop",
                "* * * * *",
                name=f"cron-{i}",
                timezone="Europe/Rome",
                overlap="overlap",
            )
        else:
            register(
                "tasks.noop",
                timedelta(seconds=20 + 10 * (i % 4)),
                name=f"every-{i}",
                overlap="overlap",
            )


def tick_both(first: Scheduler, second: Scheduler) -> list[TickReport]:
    reports: list[TickReport] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(scheduler: Scheduler) -> None:
        try:
            barrier.wait()
            scheduler.tick()
            reports.append(scheduler.last_report)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return reports


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("with_gate", [False, True], ids=["database-only", "redis-gate"])
def test_two_beats_send_every_window_exactly_once(
    postgres_url: str, redis_url: str, clock: FakeClock, with_gate: bool
) -> None:
    declare_routines()
    conf = {"routines_redis_url": redis_url} if with_gate else {}
    first = Scheduler(redis_app(redis_url, postgres_url, **conf), clock=clock)
    second = Scheduler(redis_app(redis_url, postgres_url, **conf), clock=clock)
    start = clock.now
    try:
        reports: list[TickReport] = []
        for _ in range(STEPS):
            reports += tick_both(first, second)
            clock.now += STEP
        store = first.store
        with store.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT t.name, t.cron, t.interval_seconds, t.timezone, r.idempotency_key, "
                    "r.id, r.state FROM routine_runs r JOIN routines t ON t.id = r.routine_id"
                )
            ).all()
        # Each beat adopted at `start`; the last tick ran at clock.now - STEP.
        last_tick = clock.now - STEP
        expected: set[tuple[str, str]] = set()
        for record in store.routines.all():
            schedule = schedule_from_columns(
                record.cron, record.interval_seconds, record.timezone or "UTC"
            )
            first_window = schedule.next_after(start)
            windows = [first_window, *schedule.windows(first_window, last_tick)]
            expected |= {
                (record.name, window_key(record.name, w, record.timezone or "UTC"))
                for w in windows
                if w <= last_tick
            }
        actual = [(row.name, row.idempotency_key) for row in rows]
        assert len(actual) == len(set(actual)), "a window has two run rows"
        assert set(actual) == expected, (
            f"missing {len(expected - set(actual))}, unexpected {len(set(actual) - expected)}"
        )
        assert {row.state for row in rows} == {"sent"}
        # One message per run row on the broker, no more.
        broker = redis.Redis.from_url(redis_url)
        assert broker.llen("celery") == len(rows)
        # The claim kept the beats apart: neither ever reached the unique key.
        assert sum(r.conflicts for r in reports) == 0
        assert sum(r.sent for r in reports) == len(rows)
        assert len(rows) > 5000
    finally:
        first.close()
        second.close()
