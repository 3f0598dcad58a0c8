"""The worker's after-run ceiling check (guarantee 9), through Celery's tracer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from celery import Celery
from sqlalchemy import text

from celery_routines import spend, worker
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.test_worker import deliver, make_run, register_task


@pytest.fixture(autouse=True)
def _worker_clock(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> Iterator[None]:
    monkeypatch.setattr(worker, "clock", clock)
    yield
    for key in list(worker._stores):
        worker._stores.pop(key).dispose()
    worker._settings.clear()


@pytest.fixture
def app(database_url: str, store: Store) -> Celery:
    app = Celery("ceiling_after_run_test", set_as_current=False)
    app.conf.update(routines_database_url=database_url, broker_url="memory://")
    return app


def test_the_after_run_check_suspends_when_the_period_is_spent(
    app: Celery, store: Store, clock: FakeClock
) -> None:
    @register_task(app, "spender")
    def spender() -> None:
        spend(60, "eur")

    ceiling = json.dumps([{"limit": 100, "per": "day", "unit": "eur"}])
    run_id = make_run(store, "spender", timezone="Europe/Rome", ceiling=ceiling)
    deliver(spender, run_id, "spender").get()
    assert store.routines.by_name("spender").suspended_until is None
    # A second run of another window in the same day: 120 eur of 100.
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE routine_runs SET idempotency_key = 'spender@earlier' WHERE id = :id"),
            {"id": run_id},
        )
    second = make_run(store, "spender")
    deliver(spender, second, "spender").get()
    record = store.routines.by_name("spender")
    assert record.suspended_until == datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    assert record.suspended_reason == (
        "ceiling 100 eur/day reached (120 used); resumes 2026-12-01 00:00 CET (Europe/Rome)"
    )
