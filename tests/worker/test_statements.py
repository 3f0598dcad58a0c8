"""What a run costs its worker in statements, pinned: the claim (which starts
the run and stamps its deadline on the database's clock) and the outcome
(which also reads whether the routine has a ceiling) are one statement each
when the routine has no ceiling. MySQL has no RETURNING: its outcome needs
the ceiling read after it.

Counted with SQLAlchemy's ``before_cursor_execute`` event on the worker's
own engine, through Celery's real tracer (``Task.apply``), with the worker's
real clock (so the database's clock is the one deadlines are stamped on).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import event

from celery_routines import register
from celery_routines.clock import utc_now
from celery_routines.store import Store
from celery_routines.store import engine as engine_module
from celery_routines.worker import heartbeat
from celery_routines.worker import hooks as worker
from tests.worker.runs import backend_pid, cut, kept_backend_pid, routine_task, sent_run

TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK")


@pytest.fixture(autouse=True)
def _real_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "clock", utc_now)


def statements_of_one_run(app: Celery, task: Any, run_id: str, routine: str) -> list[str]:
    """The statements the worker's engine ran for one delivery of ``run_id``."""
    engine = worker.store_for(app).engine
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])  # (conn, cursor, statement, parameters, ...)

    event.listen(engine, "before_cursor_execute", record)
    try:
        task.apply(task_id=run_id, headers={"routine": routine}).get()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return [s for s in statements if not s.lstrip().upper().startswith(TRANSACTION_CONTROL)]


def test_a_run_of_a_routine_without_a_ceiling_costs_its_worker_two_statements(
    app: Celery, store: Store, database_url: str
) -> None:
    task = routine_task(app, "plain")
    # Warm up: the first delivery also connects (and SQLite configures) the engine.
    task.apply(task_id=sent_run(store, "plain"), headers={"routine": "plain"}).get()
    run_id = sent_run(store, "plain")
    before = utc_now()

    queries = statements_of_one_run(app, task, run_id, "plain")

    mysql = database_url.startswith("mysql")
    assert len(queries) == (3 if mysql else 2), queries
    assert [q.lstrip().split()[0].upper() for q in queries[:2]] == ["UPDATE", "UPDATE"], queries
    run = store.runs.get(run_id)
    assert run is not None and run.state == "succeeded"
    # The claim stamped the deadline: the run timeout after the database's clock.
    lower = before + timedelta(seconds=3600 - 5)
    assert lower <= run.deadline_at <= utc_now() + timedelta(seconds=3600 + 5)


def test_a_run_of_a_routine_with_a_ceiling_still_gets_its_ceiling_checked(
    app: Celery, store: Store
) -> None:
    ceiling = json.dumps([{"limit": 1, "per": "day", "unit": "fires"}])
    task = routine_task(app, "capped")
    run_id = sent_run(store, "capped", ceiling=ceiling)

    queries = statements_of_one_run(app, task, run_id, "capped")

    assert len(queries) > 2, queries
    record = store.routines.by_name("capped")
    assert record is not None and record.suspended_until is not None
    assert record.suspended_until > datetime.now(UTC)


# -- a pooled connection is pinged only after it sat idle ----------------------


def test_a_connection_cut_while_idle_is_replaced_at_checkout(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.from_url(postgres_url, ping_after_idle=30)
    try:
        store.migrate()
        first = backend_pid(store)
        cut(postgres_url, first)
        now = [time.monotonic()]
        monkeypatch.setattr(engine_module.time, "monotonic", lambda: now[0])
        now[0] += 31  # idle longer than ping_after_idle: pinged, found cut, replaced
        assert backend_pid(store) != first
    finally:
        store.dispose()


def test_a_connection_used_a_moment_ago_is_not_pinged(postgres_url: str) -> None:
    store = Store.from_url(postgres_url, ping_after_idle=30)
    try:
        backend_pid(store)
        pings: list[object] = []
        monkey = store.engine.dialect.do_ping
        store.engine.dialect.do_ping = lambda conn: pings.append(conn) or monkey(conn)  # type: ignore[method-assign]
        backend_pid(store)
        assert pings == []
    finally:
        store.dispose()


def test_a_claim_on_a_connection_cut_a_moment_ago_is_retried_once_and_the_body_runs_once(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store.from_url(postgres_url)
    store.migrate()
    app = Celery("cut_test", set_as_current=False)
    app.conf.update(routines_database_url=postgres_url, broker_url="memory://")
    ran: list[str] = []

    @app.task(name=f"tests.worker.statements.cut.{uuid.uuid4().hex[:8]}")
    def job() -> None:
        ran.append("job")

    register(job, timedelta(hours=1), name="cut")
    try:
        job.apply(task_id=sent_run(store, "cut"), headers={"routine": "cut"}).get()
        # The worker's kept connection dies right after its last use (within
        # PING_AFTER_IDLE): no ping catches it, the claim's statement fails.
        cut(postgres_url, kept_backend_pid(worker.store_for(app)))
        run_id = sent_run(store, "cut")
        with caplog.at_level(logging.INFO, logger="celery_routines.worker"):
            job.apply(task_id=run_id, headers={"routine": "cut"}).get()
        assert ran == ["job", "job"]
        assert store.runs.get(run_id).state == "succeeded"
        assert "its connection was cut" in caplog.text and "trying again at once" in caplog.text
    finally:
        store.dispose()


def test_a_run_shorter_than_its_first_heartbeat_starts_no_thread(
    app: Celery, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched: list[str] = []
    monkeypatch.setattr(heartbeat.Heartbeat, "launch", lambda self: launched.append(self.run_id))
    task = routine_task(app, "short")
    run_id = sent_run(store, "short")
    task.apply(task_id=run_id, headers={"routine": "short"}).get()
    assert store.runs.get(run_id).state == "succeeded"
    assert launched == []
    assert not any(t.name.endswith(run_id[:8]) for t in threading.enumerate())
