"""Sentry Crons for routines, in process: the monitor config each definition
gives, and the check-in and headers every run gets before it is published
(the real beat/worker comparison with Celery's beat is
tests/integrations/test_sentry_crons_real.py)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from celery_routines.config import Settings
from celery_routines.policy.routine import Routine
from celery_routines.sending.offload import monitored
from celery_routines.sending.publish import OutgoingRun, Publisher
from celery_routines.sending.sender import outgoing_run
from celery_routines.store import NewRun
from tests.integrations.sentry_recorder import SentryRecorder

sentry_sdk = pytest.importorskip("sentry_sdk")
from celery_routines.integrations.sentry import CronsPublisher, monitor_config  # noqa: E402


def routine(**fields: object) -> Routine:
    values: dict[str, object] = {
        "name": "nightly", "task": "t", "cron": None, "interval_seconds": None, "timezone": None,
    }  # fmt: skip
    values.update(fields)
    return Routine(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"cron": "30 2 * * *", "timezone": "Europe/Rome", "max_lateness": 90},
            {"schedule": {"type": "crontab", "value": "30 2 * * *"},
             "timezone": "Europe/Rome", "max_runtime": 60, "checkin_margin": 2},
        ),
        (
            {"interval_seconds": 7200, "run_timeout": 30},
            {"schedule": {"type": "interval", "value": 2, "unit": "hour"},
             "timezone": "Asia/Tokyo", "max_runtime": 1},
        ),
        (
            {"interval_seconds": 90},  # not whole minutes: Sentry cannot say it
            {},
        ),
        ({"cron": "0 6 * * *", "jitter": 600}, {}),
        ({"solar": "sunrise 45.0 9.0"}, {}),
        ({"at": datetime(2027, 1, 1, tzinfo=UTC)}, {}),
        ({"interval_seconds": 30}, {}),
    ],
    ids=["cron-zone-margin", "interval-hours", "90s", "jitter", "solar", "one-off", "30s"],
)  # fmt: skip
def test_the_monitor_config_comes_from_the_routine(
    fields: dict[str, object], expected: dict[str, object]
) -> None:
    assert monitor_config(routine(**fields), "Asia/Tokyo", 3600) == expected


class Recording(Publisher):
    def __init__(self) -> None:
        self.sent: list[OutgoingRun] = []

    def publish(self, run: OutgoingRun) -> None:
        self.sent.append(run)

    def publish_many(self, runs: Sequence[OutgoingRun]) -> list[Exception | None]:
        self.sent.extend(runs)
        return [None] * len(runs)

    def close(self) -> None:
        pass


def _what_sentry_patches() -> list[tuple[Any, str]]:
    """The attributes CeleryIntegration replaces (sentry_sdk/integrations/celery)."""
    import celery.app.trace
    import celery.beat
    from billiard.pool import Worker
    from celery import Celery, Task
    from kombu import Producer

    patched = [
        (celery.app.trace, "build_tracer"),
        (Task, "apply_async"),
        (Celery, "send_task"),
        (Worker, "workloop"),
        (Producer, "publish"),
        (celery.beat.Scheduler, "apply_entry"),
    ]
    with contextlib.suppress(ImportError):
        from redbeat import RedBeatScheduler

        patched.append((RedBeatScheduler, "apply_async"))
    return patched


@pytest.fixture
def recorder() -> Iterator[SentryRecorder]:
    """Sentry on, for this test only: its patches of Celery and kombu are
    undone afterwards. Left in place (they add headers to every send_task
    even without a client), a later test in the same process compared a
    publishing process's message with send_task's and found Sentry's headers
    on one side only."""
    from sentry_sdk import integrations
    from sentry_sdk.integrations.celery import CeleryIntegration

    # Sentry sets some on a subclass that inherited them (RedBeat's apply_async).
    originals = [(owner, name, owner.__dict__.get(name)) for owner, name in _what_sentry_patches()]
    server = SentryRecorder()
    sentry_sdk.init(
        dsn=server.dsn,
        integrations=[CeleryIntegration(monitor_beat_tasks=True, exclude_beat_tasks=["quiet-.*"])],
        default_integrations=False,
    )
    try:
        yield server
    finally:
        sentry_sdk.flush(5)
        sentry_sdk.init(dsn=None)
        server.close()
        for owner, name, original in originals:
            if original is not None:
                setattr(owner, name, original)
            elif name in owner.__dict__:
                delattr(owner, name)
        # So the next init patches again what was just restored (a name left in
        # either set makes it skip setup_once, and a second test found Sentry off).
        integrations._installed_integrations.discard(CeleryIntegration.identifier)
        integrations._processed_integrations.discard(CeleryIntegration.identifier)


def run_of(definition: Routine) -> OutgoingRun:
    window = datetime(2026, 12, 2, 1, 30, tzinfo=UTC)
    new = NewRun(id=str(uuid.uuid4()), routine_id=1, attempt=1, scheduled_for=window,
                 idempotency_key=f"{definition.name}@{window.isoformat()}")  # fmt: skip
    return outgoing_run(definition, new)


def test_each_run_gets_an_in_progress_check_in_and_the_headers_the_worker_closes_it_with(
    recorder: SentryRecorder,
) -> None:
    inner = Recording()
    publisher = monitored(inner, Settings(timezone="Europe/Rome"))  # type: ignore[arg-type]
    assert isinstance(publisher, CronsPublisher)
    nightly = routine(cron="30 2 * * *", options={"headers": {"mine": 1}})
    quiet = routine(name="quiet-one", cron="* * * * *")
    assert publisher.publish_many([run_of(nightly), run_of(quiet)]) == [None, None]
    sentry_sdk.flush(5)
    [check_in] = recorder.recorded()
    assert (check_in["monitor_slug"], check_in["status"]) == ("nightly", "in_progress")
    assert check_in["monitor_config"]["timezone"] == "Europe/Rome"

    sent, skipped = inner.sent
    headers = sent.options["headers"]
    assert headers["mine"] == 1  # the routine's own headers stay
    assert headers["sentry-monitor-slug"] == headers["headers"]["sentry-monitor-slug"] == "nightly"
    assert headers["sentry-monitor-check-in-id"] == check_in["check_in_id"]
    assert float(headers["sentry-monitor-start-timestamp-s"]) > 0
    # The definition rides only as far as the monitoring publisher.
    assert sent.routine is None and skipped.routine is None
    assert "headers" not in skipped.options  # excluded by exclude_beat_tasks


# Sentry's send_task patch, and nothing of ours, puts this on every message:
# the enqueue instant its worker side reports queue latency from.
SENTRY_SEND_TASK_HEADERS = {"sentry-task-enqueued-time"}


def headers_sent_by(publisher: Any, url: str) -> dict[str, Any]:
    from tests.sending.test_direct_publish import decoded, take_messages

    try:
        publisher.publish(run_of(routine(cron="30 2 * * *")))
    finally:
        publisher.close()
    [[envelope]] = take_messages(url).values()
    message = decoded(envelope)
    return {**message["headers"], **message["headers"].get("headers", {})}


def test_direct_messages_miss_what_sentry_adds_around_send_task(
    redis_url: str, recorder: SentryRecorder
) -> None:
    """Why ``routines_publish = "direct"`` is not the default (issue 36;
    docs/performance.md, "Why the defaults are not the fastest path"): what libraries add by
    wrapping ``send_task`` never runs on a direct message. If this fails
    because the direct message gained Sentry's header, that reason is gone:
    revisit the default (tests/sending/test_default_publish.py)."""
    from celery_routines.sending.direct import DirectPublisher
    from celery_routines.sending.publish import CeleryPublisher
    from tests.sending.test_direct_publish import app_for

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
