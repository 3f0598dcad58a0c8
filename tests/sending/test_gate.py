"""The Redis idempotency gate, against real Redis."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from celery_routines import Scheduler, register
from celery_routines.sending.gate import KEY_PREFIX, RedisGate
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published

pytestmark = pytest.mark.redis


def test_set_nx_lets_one_holder_through_for_no_longer_than_the_claim(redis_url: str) -> None:
    first = RedisGate(redis_url, "beat-1", ttl_seconds=60)
    second = RedisGate(redis_url, "beat-2", ttl_seconds=60)
    try:
        assert first.acquire(["poll@2026-11-30T12:00:00+00:00#1", "other#1"]) == [True, True]
        assert second.acquire(["poll@2026-11-30T12:00:00+00:00#1"]) == [False]
        client = redis.Redis.from_url(redis_url)
        key = KEY_PREFIX + "poll@2026-11-30T12:00:00+00:00#1"
        assert client.get(key) == b"beat-1"
        assert 0 < client.pttl(key) <= 60_000
    finally:
        first.close()
        second.close()


def scheduler_with_gate(
    tmp_path: Path, database_url: str, redis_url: str, clock: FakeClock
) -> Scheduler:
    app = filesystem_app(
        tmp_path / "broker", database_url, routines_redis_url=redis_url, routines_lock_ttl=30
    )
    return Scheduler(app, clock=clock)


def test_a_key_without_a_run_row_leaves_the_window_due_instead_of_losing_it(
    tmp_path: Path, database_url: str, redis_url: str, clock: FakeClock
) -> None:
    """A beat that set the key and died before writing its row must not make
    the window disappear: the survivor waits for the claim and key to expire."""
    register("tasks.poll", timedelta(minutes=1), name="poll")
    scheduler = scheduler_with_gate(tmp_path, database_url, redis_url, clock)
    client = redis.Redis.from_url(redis_url)
    try:
        scheduler.tick()
        clock.advance(minutes=1)
        key = KEY_PREFIX + "poll@2026-11-30T12:01:00+00:00#1"
        client.set(key, "a-dead-beat", px=30_000)
        scheduler.tick()
        assert published(tmp_path / "broker") == []
        record = scheduler.store.routines.by_name("poll")
        assert record.next_run_at == clock.now  # not advanced past the window
        assert scheduler.last_report.deferred == 1
        client.delete(key)  # what the key's TTL does
        clock.advance(seconds=31)  # and the claim's
        scheduler.tick()
        assert [m["routine_window"] for m in published(tmp_path / "broker")] == [
            "poll@2026-11-30T12:01:00+00:00"
        ]
    finally:
        scheduler.close()
        client.close()


def test_a_key_whose_run_row_exists_means_another_beat_sent_it(
    tmp_path: Path, database_url: str, redis_url: str, clock: FakeClock
) -> None:
    register("tasks.poll", timedelta(minutes=1), name="poll")
    first = scheduler_with_gate(tmp_path, database_url, redis_url, clock)
    second = scheduler_with_gate(tmp_path, database_url, redis_url, clock)
    try:
        first.tick()
        clock.advance(minutes=1)
        first.tick()
        assert len(published(tmp_path / "broker")) == 1
        # Make the routine due again for the same window, as if first's
        # advance had been lost: the gate refuses, the row exists, nothing is sent.
        store = first.store
        from celery_routines.store import Advance

        [record] = store.routines.claim_due(clock.now + timedelta(minutes=1), "x", 1, 10)
        store.routines.advance([Advance(record.id, clock.now)], "x", clock.now)
        second.tick()
        assert len(published(tmp_path / "broker")) == 1
        assert second.last_report.conflicts == 1 and second.last_report.sent == 0
        assert store.routines.by_name("poll").next_run_at > clock.now
    finally:
        first.close()
        second.close()


def test_an_unreachable_gate_steps_aside_and_says_so_once(
    tmp_path: Path, sqlite_url: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # No worker: overlap="overlap" sends every window although runs stay open.
    register("tasks.poll", timedelta(seconds=10), name="poll", overlap="overlap")
    app = filesystem_app(
        tmp_path / "broker", sqlite_url, routines_redis_url="redis://127.0.0.1:1/0"
    )
    scheduler = Scheduler(app, clock=clock)
    try:
        with caplog.at_level(logging.WARNING, logger="celery_routines.gate"):
            for _ in range(6):
                clock.advance(seconds=10)
                scheduler.tick()
        assert len(published(tmp_path / "broker")) == 5  # adopted at 12:00:10
        degraded = [r for r in caplog.records if "gate degraded" in r.getMessage()]
        assert len(degraded) == 1
    finally:
        scheduler.close()


def test_a_batch_longer_than_one_script_call_answers_each_key_in_order(redis_url: str) -> None:
    from celery_routines.sending.gate import KEYS_PER_CALL

    first = RedisGate(redis_url, "beat-1", ttl_seconds=60)
    second = RedisGate(redis_url, "beat-2", ttl_seconds=60)
    keys = [f"burst-{i}@2026-11-30T12:00:00+00:00#1" for i in range(2 * KEYS_PER_CALL + 7)]
    # Another beat holds a few windows, on both sides of a call's boundary.
    held = {3, KEYS_PER_CALL - 1, KEYS_PER_CALL, 2 * KEYS_PER_CALL + 6}
    client = redis.Redis.from_url(redis_url)
    try:
        assert second.acquire([keys[i] for i in sorted(held)]) == [True] * len(held)
        answers = first.acquire(keys)
        assert answers == [i not in held for i in range(len(keys))]
        assert client.get(KEY_PREFIX + keys[KEYS_PER_CALL]) == b"beat-2"
        last = KEY_PREFIX + keys[2 * KEYS_PER_CALL + 5]
        assert client.get(last) == b"beat-1"
        assert 0 < client.pttl(last) <= 60_000
        # Asked again, each key answers as before: this beat's own keys let it
        # through (a command whose answer was lost is sent again), the other's not.
        assert first.acquire(keys) == answers
        assert second.acquire(keys) == [i in held for i in range(len(keys))]
    finally:
        client.close()
        first.close()
        second.close()
