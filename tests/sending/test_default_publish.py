"""Issue 36, item 4: the default publish path stays ``send_task`` in beat's own
process, and why (README, "Why the defaults are not the fastest path").

``routines_publish = "direct"`` puts on the broker the message ``send_task``
puts there (tests/sending/test_direct_publish.py) *as Celery builds it*; what
other libraries add by wrapping ``Celery.send_task``, ``Task.apply_async`` or
kombu's ``Producer.publish`` never runs on it. Sentry's CeleryIntegration is
the common case: its ``send_task`` patch adds ``sentry-task-enqueued-time``
to every message (the worker reports queue latency from it) and, inside an
active trace, the ``sentry-trace`` and ``baggage`` headers the worker's
transaction continues; its ``Producer.publish`` patch records a publish span,
and the direct path's Redis push does not go through ``Producer.publish``.
Sentry Crons' check-in headers are ours to add (integrations/sentry.py) and
are on both paths. If the second test here ever fails because the direct
message gained what Sentry adds, this reason to keep ``send_task`` the
default is gone: revisit it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from celery import Celery

from celery_routines.config import Settings, settings_from
from celery_routines.policy.routine import define
from celery_routines.sending.delivery import outgoing_run
from celery_routines.sending.direct import DirectPublisher
from celery_routines.sending.offload import ProcessPublisher, beats_publisher, monitored
from celery_routines.sending.publish import CeleryPublisher, OutgoingRun, Publisher
from celery_routines.store import NewRun
from tests.integrations.sentry_recorder import SentryRecorder
from tests.sending.test_direct_publish import app_for, decoded, take_messages

WINDOW = datetime(2026, 12, 3, 2, 30, tzinfo=UTC)
# Sentry's send_task patch, and nothing of ours, puts this on every message:
# the enqueue instant its worker side reports queue latency from.
SENTRY_SEND_TASK_HEADERS = {"sentry-task-enqueued-time"}


def test_defaults_publish_with_send_task_in_beats_own_process() -> None:
    app = Celery("defaults", set_as_current=False)
    settings = settings_from(app)
    assert (settings.publish, settings.publish_processes) == ("send_task", 0)
    publisher = beats_publisher(app, settings)
    inner = getattr(publisher, "inner", publisher)  # Sentry Crons' wrapper, if loaded
    assert type(inner) is CeleryPublisher
    assert not isinstance(inner, (DirectPublisher, ProcessPublisher))
    publisher.close()


@pytest.fixture
def sentry() -> Iterator[SentryRecorder]:
    sentry_sdk = pytest.importorskip("sentry_sdk")
    from sentry_sdk.integrations.celery import CeleryIntegration

    server = SentryRecorder()
    sentry_sdk.init(
        dsn=server.dsn,
        integrations=[CeleryIntegration(monitor_beat_tasks=True)],
        default_integrations=False,
        traces_sample_rate=1.0,
    )
    yield server
    sentry_sdk.flush(5)
    sentry_sdk.init(dsn=None)  # Sentry's patches stay; without a client they pass through
    server.close()


def a_run() -> OutgoingRun:
    routine = define("tasks.nightly", "30 2 * * *", name="nightly")
    new = NewRun(id="run-sentry", routine_id=1, idempotency_key="nightly@w", attempt=1,
                 scheduled_for=WINDOW)  # fmt: skip
    return outgoing_run(routine, new)


def headers_sent_by(publisher: Publisher, url: str) -> dict[str, object]:
    try:
        publisher.publish(a_run())
    finally:
        publisher.close()
    [[envelope]] = take_messages(url).values()
    message = decoded(envelope)
    return {**message["headers"], **message["headers"].get("headers", {})}


def test_direct_messages_miss_what_sentry_adds_around_send_task(
    redis_url: str, sentry: SentryRecorder
) -> None:
    app = app_for(redis_url)
    app.finalize()
    settings = Settings()
    by_send_task = headers_sent_by(monitored(CeleryPublisher(app), settings), redis_url)
    direct = headers_sent_by(monitored(DirectPublisher(app), settings), redis_url)
    # Sentry Crons: ours, on both paths.
    assert by_send_task["sentry-monitor-slug"] == direct["sentry-monitor-slug"] == "nightly"
    # Sentry's send_task patch: on send_task's messages only.
    assert by_send_task.keys() >= SENTRY_SEND_TASK_HEADERS
    assert not SENTRY_SEND_TASK_HEADERS & direct.keys()
