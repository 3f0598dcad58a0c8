"""The worker side against real databases: the claim before the body, outcomes,
retries scheduled by failures, Celery's own retries, and tasks left alone.

Tasks run through Celery's real tracer (``Task.apply`` builds the same tracer a
worker does, calling ``before_start`` and firing the same signals).
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, shared_task
from celery.exceptions import WorkerLostError
from sqlalchemy import event, text

from celery_routines import register, spend
from celery_routines.store import NewRun, Store
from celery_routines.worker import counting
from celery_routines.worker import hooks as worker
from celery_routines.worker.ceiling import check_after_run
from celery_routines.worker.stores import forget_stores
from tests.conftest import FakeClock
from tests.harness import insert_routine

WINDOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
calls: list[str] = []


@shared_task(name="tests.worker.shared_job")
def shared_job() -> str:
    calls.append("shared")
    return "shared"


@pytest.fixture(autouse=True)
def _reset(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    calls.clear()
    monkeypatch.setattr(worker, "clock", clock)


def make_run(store: Store, routine: str, attempt: int = 1, **columns: Any) -> str:
    record = store.routines.by_name(routine)
    if record is None:
        insert_routine(store, routine, interval_seconds=60, **columns)
        record = store.routines.by_name(routine)
    run_id = str(uuid.uuid4())
    store.runs.insert_new(
        [
            NewRun(
                id=run_id,
                routine_id=record.id,
                idempotency_key=f"{routine}@{WINDOW.isoformat()}",
                attempt=attempt,
                scheduled_for=WINDOW,
            )
        ],
        WINDOW,
    )
    store.runs.mark_sent([run_id], WINDOW)
    return run_id


def deliver(task: Any, run_id: str, routine: str, **options: Any) -> Any:
    """One delivery of a routine message, through Celery's tracer."""
    return task.apply(task_id=run_id, headers={"routine": routine}, **options)


def test_the_run_is_claimed_before_the_body_and_its_success_recorded_with_spend(
    app: Celery, store: Store, clock: FakeClock
) -> None:
    seen: list[str | None] = []

    @register_task(app, "job")
    def job() -> str:
        run = store.runs.get(run_id)
        seen.append(run.state if run else None)
        spend(3, "emails")
        return "done"

    run_id = make_run(store, "job")
    assert deliver(job, run_id, "job").get() == "done"
    assert seen == ["running"]  # the claim came first
    run = store.runs.get(run_id)
    assert run.state == "succeeded"
    assert run.started_at == run.finished_at == clock.now
    assert run.worker
    assert run.spend == '{"fires": 1, "emails": 3}'
    assert run.deadline_at == clock.now + timedelta(seconds=3600)


def register_task(app: Celery, name: str, **options: Any) -> Any:
    """``@app.task`` plus ``register()``, as ``@routine`` would do."""

    def decorate(fun: Any) -> Any:
        # Unique task names: Celery warns about a name reused by another callable.
        task = app.task(name=f"tests.worker.{name}.{uuid.uuid4().hex[:8]}", **options)(fun)
        register(task, timedelta(hours=1), name=name)
        return task

    return decorate


@pytest.mark.parametrize("kind", ["app_task", "bound", "shared_task", "worker_init"])
def test_a_second_delivery_of_the_same_run_does_not_run_the_body(
    app: Celery, store: Store, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    if kind == "app_task":

        @register_task(app, "job")
        def job() -> None:
            calls.append("job")

        task = job
    elif kind == "bound":

        @register_task(app, "job", bind=True)
        def bound_job(self: Any) -> None:
            calls.append(self.request.id)

        task = bound_job
    elif kind == "shared_task":
        task = app.tasks["tests.worker.shared_job"]
        register(task, timedelta(hours=1), name="job")
    else:
        # Never declared with routine()/register(): a beat_schedule entry or a
        # row inserted by SQL. The worker_init signal installs the hook.
        plain_name = f"tests.worker.plain.{uuid.uuid4().hex[:8]}"

        @app.task(name=plain_name)
        def plain() -> None:
            calls.append("plain")

        task = app.tasks[plain_name]
        worker.on_worker_init(sender=SimpleNamespace(app=app))
    run_id = make_run(store, "job")
    refused_before = worker.refused_deliveries()
    deliver(task, run_id, "job")
    with caplog.at_level(logging.WARNING, logger="celery_routines.worker"):
        deliver(task, run_id, "job")
    assert len(calls) == 1, "the body ran twice"
    run = store.runs.get(run_id)
    assert (run.state, run.duplicates) == ("succeeded", 1)
    assert worker.refused_deliveries() == refused_before + 1
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert run_id in warning.getMessage() and "already succeeded" in warning.getMessage()


def test_a_delivery_of_an_unknown_run_does_not_run_the_body(
    app: Celery, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    @register_task(app, "job")
    def job() -> None:
        calls.append("job")

    make_run(store, "job")  # the routine exists; this run id does not
    missing = str(uuid.uuid4())
    with caplog.at_level(logging.WARNING, logger="celery_routines.worker"):
        deliver(job, missing, "job")
    assert calls == []
    # Not called a duplicate: there is no run it would duplicate.
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert missing in warning.getMessage() and "no such run row" in warning.getMessage()
    assert "duplicate" not in warning.getMessage()


def test_a_task_called_directly_is_untouched(app: Celery, store: Store) -> None:
    @register_task(app, "job")
    def job() -> str:
        calls.append("job")
        return "direct"

    assert job.apply().get() == "direct"
    assert job() == "direct"
    assert calls == ["job", "job"]


def test_a_user_defined_before_start_runs_after_a_granted_claim_only(
    app: Celery, store: Store
) -> None:
    from celery import Task

    class Audited(Task):
        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            calls.append("user before_start")

    @register_task(app, "job", base=Audited)
    def job() -> None:
        calls.append("body")

    run_id = make_run(store, "job")
    deliver(job, run_id, "job")
    deliver(job, run_id, "job")
    assert calls == ["user before_start", "body"]


def test_a_failure_records_the_error_and_schedules_the_retry(
    app: Celery, store: Store, clock: FakeClock
) -> None:
    @register_task(app, "job")
    def job() -> None:
        raise RuntimeError("disk full")

    run_id = make_run(store, "job", retry_base_seconds=60, max_retries=4)
    deliver(job, run_id, "job")
    run = store.runs.get(run_id)
    assert (run.state, run.error) == ("retrying", "RuntimeError: disk full")
    assert run.finished_at == clock.now
    assert run.retry_at == clock.now + timedelta(minutes=1)


def test_the_last_attempt_fails_for_good(app: Celery, store: Store) -> None:
    @register_task(app, "job")
    def job() -> None:
        raise RuntimeError("still broken")

    run_id = make_run(store, "job", attempt=3, max_retries=2)
    deliver(job, run_id, "job")
    run = store.runs.get(run_id)
    assert (run.state, run.retry_at) == ("failed", None)


def test_a_paused_routines_failure_schedules_no_retry(app: Celery, store: Store) -> None:
    @register_task(app, "job")
    def job() -> None:
        with store.engine.begin() as conn:  # paused while it ran
            conn.execute(text("UPDATE routines SET paused = true WHERE name = 'job'"))
        raise RuntimeError("boom")

    run_id = make_run(store, "job")
    deliver(job, run_id, "job")
    run = store.runs.get(run_id)
    assert (run.state, run.retry_at, run.reason) == ("failed", None, "no_retry:paused")


def test_a_lost_pool_process_makes_the_run_lost_and_retried(
    app: Celery, store: Store, clock: FakeClock
) -> None:
    @register_task(app, "job")
    def job() -> None:
        pass

    run_id = make_run(store, "job")
    assert store.outcomes.claim_start(run_id, "w1", clock.now)
    # What the worker's main process reports when the pool child running the
    # task dies (it pushes the request so handlers see the headers).
    job.push_request(id=run_id, headers={"routine": "job"})
    try:
        worker._on_failure(
            sender=job, task_id=run_id, exception=WorkerLostError("signal 9 (SIGKILL)")
        )
    finally:
        job.pop_request()
    run = store.runs.get(run_id)
    assert (run.state, run.reason) == ("retrying", "lost")
    assert run.retry_at == clock.now + timedelta(minutes=1)
    assert "WorkerLostError" in run.error


def test_celery_own_retry_redelivers_the_same_run_not_one_of_ours(
    app: Celery, store: Store
) -> None:
    @register_task(app, "job", bind=True, max_retries=3, default_retry_delay=0)
    def job(self: Any) -> str:
        calls.append(f"try {self.request.retries}")
        if self.request.retries < 2:
            raise self.retry(countdown=0)
        return "ok"

    run_id = make_run(store, "job")
    deliver(job, run_id, "job")
    assert calls == ["try 0", "try 1", "try 2"]
    run = store.runs.get(run_id)
    assert (run.state, run.duplicates, run.celery_retries) == ("succeeded", 0, 2)
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM routine_runs")).scalar_one() == 1


def test_a_delivery_that_cannot_reach_the_database_does_not_run_the_body(
    app: Celery, store: Store, sqlite_url: str
) -> None:
    @register_task(app, "job")
    def job() -> None:
        calls.append("job")

    app.conf.routines_database_url = "postgresql://nobody@127.0.0.1:1/none"
    app.conf.routines_database_patience = 0.5
    forget_stores()  # the new URL is read again
    result = deliver(job, str(uuid.uuid4()), "job")
    assert calls == []
    # Handed back to the broker (tests/worker/test_outage.py), not failed.
    assert result.state == "RETRY"


def test_a_celery_retry_delivery_may_take_over_its_running_run_but_a_duplicate_may_not(
    store: Store, clock: FakeClock
) -> None:
    # Celery's retry message can arrive before the retrying delivery's
    # task_retry handler put the row back to sent: request.retries tells them apart.
    run_id = make_run(store, "job")
    assert store.outcomes.claim_start(run_id, "w1", clock.now, celery_retries=0)
    assert not store.outcomes.claim_start(run_id, "w2", clock.now, celery_retries=0)
    assert store.outcomes.claim_start(run_id, "w2", clock.now, celery_retries=1)
    assert not store.outcomes.claim_start(run_id, "w3", clock.now, celery_retries=1)
    # The late task_retry handler of the first delivery changes nothing now.
    store.outcomes.requeue(run_id, celery_retries=0)
    assert store.runs.get(run_id).state == "running"


def test_celery_retry_puts_the_run_back_to_sent_for_its_redelivery(
    app: Celery, store: Store, clock: FakeClock
) -> None:
    @register_task(app, "job")
    def job() -> None:
        pass

    run_id = make_run(store, "job")
    assert store.outcomes.claim_start(run_id, "w1", clock.now)
    job.push_request(id=run_id, headers={"routine": "job"}, retries=0)
    try:
        worker._on_retry(sender=job, request=job.request, reason=SimpleNamespace(when=30))
    finally:
        job.pop_request()
    run = store.runs.get(run_id)
    assert run.state == "sent"
    # Due again in 30 s, then claimed within the start timeout (300 s).
    assert run.deadline_at == clock.now + timedelta(seconds=30 + 300)


def test_a_revoked_run_is_closed_as_failed_not_left_to_be_lost(
    app: Celery, store: Store, clock: FakeClock
) -> None:
    from celery.app.task import Context

    @register_task(app, "job")
    def job() -> None:
        pass

    run_id = make_run(store, "job")
    # What the worker's main process sends for a revoked message.
    worker._on_revoked(
        sender=job, request=Context(id=run_id, routine="job"), terminated=False, expired=False
    )
    run = store.runs.get(run_id)
    assert (run.state, run.reason, run.retry_at) == ("failed", "revoked", None)
    # A run beat replaced keeps its reason when the kill is reported.
    replaced_id = make_run(store, "job", attempt=2)
    store.runs.mark_replaced([replaced_id], "job@next", clock.now)
    worker._on_revoked(sender=job, request=Context(id=replaced_id, routine="job"), terminated=True)
    assert store.runs.get(replaced_id).reason == "replaced"


def test_a_task_with_a_hard_time_limit_is_lost_after_the_limit_plus_a_margin(
    app: Celery, store: Store, clock: FakeClock
) -> None:
    deadlines = []

    @register_task(app, "job", time_limit=30)
    def job() -> None:
        deadlines.append(store.runs.get(run_id).deadline_at)

    run_id = make_run(store, "job")
    deliver(job, run_id, "job")
    assert deadlines == [clock.now + timedelta(seconds=30 + 60)]


def test_flower_keeps_the_first_deliverys_outcome_after_a_refused_duplicate() -> None:
    # Why Ignore: the refused delivery only adds received/started events under
    # the same task id, which celery.events.state (Flower's model) merges as
    # happening before SUCCESS; Reject would store and announce a FAILURE.
    from celery.events.state import State

    state = State()
    run_id = str(uuid.uuid4())
    clock_ = iter(range(100))
    for kind in ("received", "started", "succeeded", "received", "started"):
        state.event(
            {
                "type": f"task-{kind}",
                "uuid": run_id,
                "timestamp": float(next(clock_)),
                "local_received": 0.0,
                "clock": next(clock_),
                "hostname": "w1",
            }
        )
    assert state.tasks[run_id].state == "SUCCESS"


def test_a_task_without_the_hook_still_gets_its_run_recorded(
    app: Celery, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # Registered after the worker started, so nothing installed the claim: the
    # task_prerun fallback still marks the run running, and says what is missing.
    @app.task(name=f"tests.worker.late.{uuid.uuid4().hex[:8]}")
    def late() -> None:
        calls.append("late")

    run_id = make_run(store, "job")
    with caplog.at_level(logging.WARNING, logger="celery_routines.worker"):
        deliver(late, run_id, "job")
    assert store.runs.get(run_id).state == "succeeded"
    assert any("no claim hook" in r.getMessage() for r in caplog.records)


def test_autoretry_for_keeps_working_and_only_its_final_failure_is_ours_to_retry(
    app: Celery, store: Store, clock: FakeClock
) -> None:
    @register_task(
        app, "job", bind=True, autoretry_for=(RuntimeError,), max_retries=2, default_retry_delay=0
    )
    def job(self: Any) -> None:
        calls.append(f"try {self.request.retries}")
        raise RuntimeError("flaky upstream")

    run_id = make_run(store, "job")
    deliver(job, run_id, "job")
    assert calls == ["try 0", "try 1", "try 2"]  # Celery's three deliveries of one run
    run = store.runs.get(run_id)
    assert (run.state, run.attempt, run.error) == ("retrying", 1, "RuntimeError: flaky upstream")
    assert run.retry_at == clock.now + timedelta(minutes=1)


def test_a_pool_process_started_fresh_installs_the_hook_and_rebuilds_tracers(
    app: Celery, store: Store
) -> None:
    # With the spawn start method a pool process re-creates its task classes
    # (without the hook) and builds their tracers before worker_process_init.
    from celery._state import _set_current_app, get_current_app

    name = f"tests.worker.spawned.{uuid.uuid4().hex[:8]}"

    @app.task(name=name)
    def spawned_body() -> None:
        calls.append("spawned")

    spawned = app.tasks[name]
    previous = get_current_app()
    _set_current_app(app)
    try:
        spawned.__trace__ = None
        worker.install_in_pool_process()
    finally:
        _set_current_app(previous)
    assert getattr(type(spawned).before_start, worker.HOOK_MARK, False)
    assert spawned.__trace__ is not None
    run_id = make_run(store, "job")
    deliver(spawned, run_id, "job")
    deliver(spawned, run_id, "job")
    assert calls == ["spawned"]


def test_the_after_run_check_suspends_when_the_period_is_spent(
    app: Celery, store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def suspended(self, routine: str, **fields: Any) -> None:
            sent.append((routine, fields))

    monkeypatch.setattr(counting, "events_for", lambda _app: Recorder())

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
    # Sent as an event, and noted for beat's run metrics, once.
    assert sent == [
        ("spender", {"until": record.suspended_until, "reason": record.suspended_reason})
    ]
    _, noted = store.run_metrics.since(clock(), clock(), 0)
    assert [(e.routine, e.kind) for e in noted] == [("spender", "suspended")]


def test_the_after_run_check_of_a_routine_without_a_ceiling_is_one_read(
    store: Store, clock: FakeClock
) -> None:
    run_id = make_run(store, "plain")
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])  # (conn, cursor, statement, parameters, ...)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        check_after_run(store, run_id, clock(), "UTC")
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    # Transaction control aside (the SQLite engine issues its own BEGIN IMMEDIATE).
    queries = [s for s in statements if not s.startswith(("BEGIN", "COMMIT", "ROLLBACK"))]
    assert len(queries) == 1, statements
    assert queries[0].startswith("SELECT"), queries
    assert store.routines.by_name("plain").suspended_until is None


def test_a_message_that_expired_in_the_queue_is_a_skip_reason_expired(
    app: Celery, store: Store, clock: FakeClock
) -> None:
    from celery.app.task import Context

    @register_task(app, "job")
    def job() -> None:
        pass

    run_id = make_run(store, "job")
    # What the worker's main process sends for a message past its `expires`.
    worker._on_revoked(
        sender=job, request=Context(id=run_id, routine="job"), terminated=False, expired=True
    )
    run = store.runs.get(run_id)
    assert (run.state, run.reason, run.retry_at) == ("skipped", "expired", None)
    # A run that already started keeps its outcome.
    started = make_run(store, "job", attempt=2)
    assert store.outcomes.claim_start(started, "w1", clock.now)
    worker._on_revoked(sender=job, request=Context(id=started, routine="job"), expired=True)
    assert store.runs.get(started).state == "running"
