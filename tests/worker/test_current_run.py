"""``current_run()`` through Celery's real tracer (``Task.apply``): what a
routine message's headers say, ``None`` for a direct call and outside a task,
and each thread's own run when two run at once."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_routines import RoutineRun, current_run
from celery_routines.policy.routine import Routine
from celery_routines.policy.states import RunKind
from celery_routines.sending.publish import message_options
from celery_routines.sending.sender import outgoing_run
from celery_routines.store import NewRun
from celery_routines.worker.current_run import run_of_request


@pytest.fixture
def app(sqlite_url: str, migrated_schema: None) -> Celery:
    # A real store: the worker's outcome handlers record these runs' ends
    # (no row: nothing recorded), as in a worker.
    app = Celery("current_run_test", set_as_current=False)
    app.conf.update(
        broker_url="memory://", routines_timezone="Asia/Tokyo", routines_database_url=sqlite_url
    )
    return app


def probe_task(app: Celery) -> Any:
    @app.task(name="tests.current_run.probe")
    def probe() -> RoutineRun | None:
        return current_run()

    return probe


def headers_of(kind: str = RunKind.SCHEDULED, timezone: str | None = "Europe/Rome",
               key: str = "nightly@2026-10-25T02:30:00+01:00", attempt: int = 1,
               window: datetime | None = None) -> dict[str, Any]:  # fmt: skip
    """The headers beat's publisher puts on such a run (publish.message_options)."""
    routine = Routine(name="nightly", task="t", cron="30 2 * * *", interval_seconds=None,
                      timezone=timezone)  # fmt: skip
    run = NewRun(id="r1", routine_id=1, idempotency_key=key, attempt=attempt,
                 scheduled_for=window or datetime(2026, 10, 25, 1, 30, tzinfo=UTC))  # fmt: skip
    return message_options(outgoing_run(routine, run, kind=kind), False, (1024, 3))[1]


def test_a_scheduled_window_is_the_keys_instant_in_utc_and_in_the_routines_zone(
    app: Celery,
) -> None:
    # The second 02:30 of Rome's autumn night: the key's offset tells the two apart.
    run = probe_task(app).apply(task_id="r1", headers=headers_of()).get()
    assert run == RoutineRun(
        routine="nightly",
        window=datetime(2026, 10, 25, 1, 30, tzinfo=UTC),
        local_window=run.local_window,
        attempt=1,
        run_id="r1",
        kind=RunKind.SCHEDULED,
        idempotency_key="nightly@2026-10-25T02:30:00+01:00",
    )
    assert (run.local_window.isoformat(), str(run.local_window.tzinfo)) == (
        "2026-10-25T02:30:00+01:00",
        "Europe/Rome",
    )
    assert run.local_window.fold == 1  # the later of the two 02:30s


def test_a_routine_without_its_own_zone_reads_routines_timezone(app: Celery) -> None:
    headers = headers_of(timezone=None, key="nightly@2026-06-01T00:00:00+00:00",
                         window=datetime(2026, 6, 1, tzinfo=UTC))  # fmt: skip
    assert "routine_zone" not in headers
    run = probe_task(app).apply(task_id="r2", headers=headers).get()
    assert run.local_window.isoformat() == "2026-06-01T09:00:00+09:00"


@pytest.mark.parametrize("kind", [RunKind.BACKFILL, RunKind.REPLAY])
def test_operator_sends_say_their_kind_and_keep_the_old_window(app: Celery, kind: str) -> None:
    run = probe_task(app).apply(task_id="r3", headers=headers_of(kind=kind, attempt=2)).get()
    assert (run.kind, run.attempt) == (kind, 2)
    assert run.window == datetime(2026, 10, 25, 1, 30, tzinfo=UTC)


def test_a_trigger_and_beats_retry_of_it_carry_the_triggered_instant(app: Celery) -> None:
    at = datetime(2026, 12, 2, 17, 5, 3, 250000, tzinfo=UTC)
    probe = probe_task(app)
    for kind, attempt in ((RunKind.TRIGGER, 1), (RunKind.SCHEDULED, 2)):  # beat's retry
        headers = headers_of(kind=kind, key="nightly@manual:abc", attempt=attempt, window=at)
        run = probe.apply(task_id="r4", headers=headers).get()
        assert (run.kind, run.window, run.attempt) == (RunKind.TRIGGER, at, attempt)


def test_none_for_a_direct_call_an_ordinary_message_and_outside_any_task(app: Celery) -> None:
    probe = probe_task(app)
    assert probe() is None
    assert probe.apply(task_id="r5").get() is None
    assert probe.apply(task_id="r6", headers={"other": "header"}).get() is None
    assert current_run() is None


def test_unreadable_headers_give_none_not_an_error() -> None:
    for headers in (
        {"routine": "nightly", "routine_window": "nightly@not-a-time"},
        {"routine": "nightly"},
        {"routine_window": "nightly@2026-10-25T02:30:00+01:00"},
    ):
        assert run_of_request(SimpleNamespace(id="x", headers=headers)) is None
    odd_headers = {
        "routine": "n",
        "routine_window": "n@2026-01-01T00:00:00+00:00",
        "routine_zone": "Mars/Olympus",
        "routine_kind": "weird",
        "routine_attempt": "x",
    }
    odd = run_of_request(SimpleNamespace(id="x", headers=odd_headers))
    assert odd is not None and (odd.kind, odd.attempt, odd.local_window.tzinfo) == (
        RunKind.SCHEDULED,
        1,
        UTC,
    )


def test_each_thread_sees_the_run_it_executes(app: Celery) -> None:
    both_inside = threading.Barrier(2)
    seen: dict[str, RoutineRun | None] = {}

    @app.task(name="tests.current_run.wait_and_probe")
    def wait_and_probe(label: str) -> None:
        both_inside.wait(timeout=10)
        seen[label] = current_run()

    def deliver(label: str, key: str) -> None:
        wait_and_probe.apply(args=(label,), task_id=label, headers=headers_of(key=key))

    threads = [
        threading.Thread(target=deliver, args=("a", "nightly@2026-10-25T02:30:00+02:00")),
        threading.Thread(target=deliver, args=("b", "nightly@2026-10-25T02:30:00+01:00")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert {label: (run.run_id, run.window.hour) for label, run in seen.items() if run} == {
        "a": ("a", 0),
        "b": ("b", 1),
    }
