"""The message of a run, the batch publish's answers, and a failed send
recorded under the routine's retry policy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from celery_routines.policy.routine import define
from celery_routines.sending.publish import NotSent, OutgoingRun, Publisher
from celery_routines.sending.sender import outgoing_run, publish_runs, record_send_failure
from celery_routines.store import NewRun, Store
from tests.conftest import FakeClock
from tests.operators import add_routine, add_run

WINDOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_a_run_message_carries_the_routines_call_and_its_window() -> None:
    routine = define(
        "tasks.report", 60, name="report", args=[1], kwargs={"day": "today"}, options={"queue": "q"}
    )
    run = NewRun(id="r0", routine_id=1, idempotency_key="report@w", attempt=2, scheduled_for=WINDOW)
    message = outgoing_run(routine, run, "r1")
    assert (message.task, message.args, message.kwargs, message.options) == (
        "tasks.report",
        [1],
        {"day": "today"},
        {"queue": "q"},
    )
    assert (message.run_id, message.idempotency_key, message.attempt) == ("r1", "report@w", 2)


def test_publish_runs_answers_none_or_the_error_text_per_run() -> None:
    class Half(Publisher):
        def publish_many(self, runs: list[OutgoingRun]) -> list[Exception | None]:
            return [None, ConnectionError("refused"), NotSent("not sent: ConnectionError: refused")]

    routine = define("tasks.report", 60, name="report")
    runs = [
        outgoing_run(
            routine,
            NewRun(id=f"r{i}", routine_id=1, idempotency_key="k", attempt=1, scheduled_for=WINDOW),
        )
        for i in range(3)
    ]
    assert publish_runs(Half(), runs) == [  # type: ignore[arg-type]
        None,
        "ConnectionError: refused",
        "not sent: ConnectionError: refused",
    ]


def test_a_failed_send_is_retried_under_the_routines_policy(store: Store, clock: FakeClock) -> None:
    record = add_routine(store, "report", retry_base_seconds=30.0)
    run_id = add_run(store, record, "report@w", "pending", WINDOW, WINDOW)
    record_send_failure(store, record, run_id, "report@w", 1, "ConnectionError: x", clock())
    run = store.runs.get(run_id)
    assert (run.state, run.reason, run.error) == ("retrying", "send_failed", "ConnectionError: x")
    assert run.retry_at == clock() + timedelta(seconds=30)
