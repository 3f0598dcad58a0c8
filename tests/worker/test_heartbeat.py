"""Heartbeats against real databases: the store's conditional extension, and
the thread the claim starts and the body's end stops (Celery's real tracer).
The end-to-end behaviour with real workers is in tests/e2e/test_heartbeats.py."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest
from celery import Celery

from celery_routines.store import Store
from celery_routines.worker import heartbeat
from tests.conftest import FakeClock
from tests.worker.test_hooks import _reset, make_run, register_task  # noqa: F401

pytestmark = pytest.mark.usefixtures("_reset")


def test_a_heartbeat_extends_a_running_runs_deadline_and_keeps_a_later_one(
    store: Store, clock: FakeClock
) -> None:
    run_id = make_run(store, "job")
    assert store.outcomes.claim_start(run_id, "w1", clock.now, deadline_at=clock.now)
    later = clock.now + timedelta(minutes=5)
    assert store.outcomes.heartbeat(run_id, later)
    assert store.runs.get(run_id).deadline_at == later
    assert store.outcomes.heartbeat(run_id, clock.now + timedelta(minutes=1))
    assert store.runs.get(run_id).deadline_at == later  # a time limit's later deadline stays


def test_a_heartbeat_of_a_run_no_longer_running_changes_nothing(
    store: Store, clock: FakeClock
) -> None:
    run_id = make_run(store, "job")  # sent, never claimed
    assert not store.outcomes.heartbeat(run_id, clock.now + timedelta(hours=1))
    assert store.runs.get(run_id).deadline_at is None


def test_the_body_is_heartbeaten_while_it_runs_and_the_heartbeat_ends_with_it(
    app: Celery,
    store: Store,
    clock: FakeClock,
) -> None:
    seen: list[object] = []

    @register_task(app, "long")
    def long() -> None:
        # The worker's clock moves on while the body runs: each heartbeat
        # pushes the deadline to the clock's now plus the run timeout.
        clock.advance(minutes=10)
        until = time.monotonic() + 5
        while store.runs.get(run_id).deadline_at <= clock.now and time.monotonic() < until:
            time.sleep(0.02)
        seen.append(store.runs.get(run_id).deadline_at)
        seen.append([t.name for t in threading.enumerate() if t.name.startswith("routines-h")])

    run_id = make_run(store, "long")
    long.apply(task_id=run_id, headers={"routine": "long", "routine_run_timeout": 0.3})
    assert seen[0] == clock.now + timedelta(seconds=0.3)
    assert seen[1] == [f"routines-heartbeat-{run_id[:8]}"]
    assert store.runs.get(run_id).state == "succeeded"
    until = time.monotonic() + 2
    while heartbeat._running or any(t.name == seen[1][0] for t in threading.enumerate()):
        assert time.monotonic() < until, "the heartbeat outlived its body"
        time.sleep(0.02)


def test_a_heartbeat_that_finds_its_run_gone_stops_beating() -> None:
    calls: list[str] = []

    def beat(run_id: str, deadline: object) -> bool:
        calls.append(run_id)
        return False  # declared lost meanwhile

    beating = heartbeat.Heartbeat("r1", 0.15, beat, FakeClock(datetime(2026, 1, 1))).start()
    until = time.monotonic() + 3
    while beating.alive:
        assert time.monotonic() < until
        time.sleep(0.02)
    assert calls == ["r1"]
