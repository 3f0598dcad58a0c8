"""Schedule kinds with a real celery beat and worker (PostgreSQL, Redis): a
one-off, a bounded interval, a solar beat_schedule entry, and a message that
expires in the queue."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from celery_routines.schedules.base import NEVER
from celery_routines.schedules.solar import SolarSchedule
from celery_routines.store import Store
from tests.e2e import test_lifecycle
from tests.e2e.processes import CeleryProcess, environment, wait_until
from tests.e2e.test_end_to_end import run_counts, start
from tests.harness import insert_routine

pg_store = test_lifecycle.pg_store  # a migrated PostgreSQL store, shared fixture

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


def _naive(instant: datetime) -> datetime:
    return instant.astimezone(UTC).replace(tzinfo=None)


def _scheduled(store: Store, name: str) -> list[datetime]:
    with store.engine.connect() as conn:
        return [
            row[0].replace(tzinfo=UTC)
            for row in conn.execute(
                text(
                    "SELECT r.scheduled_for FROM routine_runs r JOIN routines t "
                    "ON t.id = r.routine_id WHERE t.name = :n ORDER BY r.scheduled_for"
                ),
                {"n": name},
            )
        ]


def test_a_one_off_and_a_bounded_interval_run_then_are_done(
    tmp_path: Path, postgres_url: str, redis_url: str, pg_store: Store
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    log = tmp_path / "ran.log"
    starts_at, ends_at = now + timedelta(seconds=4), now + timedelta(seconds=8)
    insert_routine(
        pg_store,
        "once",
        task="e2e_app.record",
        args=f'["{log}"]',
        at=_naive(now + timedelta(seconds=3)),
    )
    insert_routine(
        pg_store,
        "window",
        task="e2e_app.sql_inserted",
        interval_seconds=1,
        starts_at=_naive(starts_at),
        ends_at=_naive(ends_at),
    )
    processes = start(tmp_path, environment(redis_url, postgres_url))
    try:
        wait_until(
            lambda: (
                run_counts(pg_store).get(("once", "succeeded"), 0) == 1
                and pg_store.routines.by_name("window").next_run_at == NEVER
                and not any(
                    state in ("pending", "sent", "running")
                    for (name, state) in run_counts(pg_store)
                    if name == "window"
                )
            ),
            timeout=60,
            what="the one-off to run and the bounded interval to finish",
            logs=list(processes),
        )
        assert pg_store.routines.by_name("once").next_run_at == NEVER
        assert len(log.read_text().splitlines()) == 1
        windows = _scheduled(pg_store, "window")
        assert windows and all(starts_at <= w <= ends_at for w in windows)
        assert windows[-1] == ends_at or run_counts(pg_store).get(("window", "skipped"))
    finally:
        for process in processes:
            process.stop()


def _longitude_of_sunrise_at(target: datetime) -> float:
    """A longitude on the equator whose next sunrise is ``target`` (within a second)."""
    lon = ((6 - (target.hour + target.minute / 60)) * 15 + 180) % 360 - 180
    for _ in range(8):
        sunrise = SolarSchedule("sunrise", 0, lon).next_after(target - timedelta(hours=3))
        lon += (sunrise - target).total_seconds() / 240  # 1 degree east: 4 minutes earlier
        lon = (lon + 180) % 360 - 180
    return round(lon, 4)


def test_a_solar_beat_schedule_entry_fires_at_the_sunrise(
    tmp_path: Path, postgres_url: str, redis_url: str, pg_store: Store
) -> None:
    target = datetime.now(UTC) + timedelta(seconds=15)
    lon = _longitude_of_sunrise_at(target)
    expected = SolarSchedule("sunrise", 0, lon).next_after(target - timedelta(hours=3))
    assert abs(expected - target) < timedelta(seconds=5)
    env = environment(redis_url, postgres_url, E2E_SOLAR=f"sunrise 0 {lon}")
    processes = start(tmp_path, env)
    try:
        wait_until(
            lambda: run_counts(pg_store).get(("solar-entry", "succeeded"), 0) >= 1,
            timeout=60,
            what="the solar entry to fire at its sunrise",
            logs=list(processes),
        )
        assert _scheduled(pg_store, "solar-entry") == [expected]
        record = pg_store.routines.by_name("solar-entry")
        assert record.solar == f"sunrise 0 {lon!r}"
        assert record.next_run_at > expected + timedelta(hours=23)
    finally:
        for process in processes:
            process.stop()


def test_a_message_that_expires_in_the_queue_is_skipped_not_run(
    tmp_path: Path, postgres_url: str, redis_url: str, pg_store: Store
) -> None:
    log = tmp_path / "ran.log"
    insert_routine(
        pg_store,
        "stale",
        task="e2e_app.record",
        args=f'["{log}"]',
        interval_seconds=1,
        max_lateness=1,
        overlap="overlap",
    )
    env = environment(redis_url, postgres_url)
    # Beat alone: its messages wait in the queue, with no worker to take them.
    beat = _beat_only(tmp_path, env)
    try:
        wait_until(
            lambda: run_counts(pg_store).get(("stale", "sent"), 0) >= 2,
            timeout=60,
            what="two sent runs waiting in the queue",
            logs=[beat],
        )
    finally:
        beat.stop()
    waiting = run_counts(pg_store).get(("stale", "sent"), 0)
    # A worker that comes after the last one's expiry (its window plus 1 s of
    # max_lateness) drops them all as expired. Stopping beat is not enough
    # of a wait: on a loaded machine a worker started at once took the last
    # one within its second, and ran it.
    with pg_store.engine.connect() as conn:
        last_window = conn.execute(
            text("SELECT max(scheduled_for) FROM routine_runs WHERE state = 'sent'")
        ).scalar_one()
    if last_window.tzinfo is None:  # stored as naive UTC
        last_window = last_window.replace(tzinfo=UTC)
    expired_at = last_window + timedelta(seconds=1.5)
    time.sleep(max(0.0, (expired_at - datetime.now(UTC)).total_seconds()))
    worker = _worker_only(tmp_path, env)
    try:
        wait_until(
            lambda: run_counts(pg_store).get(("stale", "skipped"), 0) >= waiting,
            timeout=60,
            what="the expired runs to be recorded skipped",
            logs=[worker],
        )
    finally:
        worker.stop()
    with pg_store.engine.connect() as conn:
        reasons = (
            conn.execute(text("SELECT DISTINCT reason FROM routine_runs WHERE state = 'skipped'"))
            .scalars()
            .all()
        )
    assert reasons == ["expired"]
    assert not log.exists()


def _beat_only(tmp_path: Path, env: dict[str, str]) -> CeleryProcess:
    args = ["beat", "-S", "routines", "--loglevel", "INFO"]
    return CeleryProcess(
        [*args, "--schedule", str(tmp_path / "celerybeat-schedule")], env, tmp_path / "beat.log"
    )


def _worker_only(tmp_path: Path, env: dict[str, str]) -> CeleryProcess:
    args = ["worker", "--pool", "solo", "--loglevel", "INFO", "--without-heartbeat"]
    return CeleryProcess(
        [*args, "--without-mingle", "--without-gossip"], env, tmp_path / "worker.log"
    )
