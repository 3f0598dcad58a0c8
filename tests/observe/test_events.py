"""Our Celery events: what a monitoring consumer receives, and that sending
one never raises into the caller."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_routines.observe.events import SKIPPED, TRIGGERED, RoutineEvents
from celery_routines.operator.admin import Routines
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.operators import add_routine, make_app

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def capture(app: Celery, send: Any) -> list[dict[str, Any]]:
    """Events received by a real consumer bound before ``send()`` runs."""
    received: list[dict[str, Any]] = []
    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": received.append})
        with receiver.consumer_context() as (conn, _channel, _consumers):
            send()
            conn.drain_events(timeout=5)
    return received


def test_a_consumer_receives_a_skip_event_with_its_fields() -> None:
    app = Celery("events_test", broker="memory://", set_as_current=False)
    events = RoutineEvents(app, hostname="beat@test")
    try:
        [event] = capture(
            app,
            lambda: events.skipped(
                "nightly", reason="catch_up_cap", count=7, first=T0, last=T0, run_id="r1"
            ),
        )
    finally:
        events.close()
    assert event["type"] == SKIPPED == "routine-skipped"
    assert event["hostname"] == "beat@test"
    assert (event["routine"], event["reason"], event["count"]) == ("nightly", "catch_up_cap", 7)
    assert event["first"] == "2026-11-30T12:00:00+00:00"


def test_an_unreachable_broker_never_raises_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_routines.events")
    app = Celery("events_test", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.broker_connection_timeout = 0.5
    app.conf.broker_connection_max_retries = 0
    events = RoutineEvents(app)
    events.lost("nightly", run_id="r1", idempotency_key="nightly@x")
    events.lost("nightly", run_id="r2", idempotency_key="nightly@y")
    events.close()
    warnings = [r for r in caplog.records if "could not send" in r.getMessage()]
    assert len(warnings) == 1


class Recording(RoutineEvents):
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, event_type: str, **fields: Any) -> None:
        self.sent.append((event_type, fields))

    def close(self) -> None:
        pass


def test_the_admin_api_reports_paused_skips_and_manual_sends_as_events(
    store: Store, database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    add_routine(store, "poll", next_run_at=T0 + timedelta(minutes=5), paused=True)
    recording = Recording()
    with Routines(make_app(tmp_path / "b", database_url), clock=clock, events=recording) as r:
        clock.advance(hours=1)
        r.resume("poll")
        sent = r.trigger("poll")
    assert [t for t, _ in recording.sent] == [SKIPPED, TRIGGERED]
    skipped, triggered = (fields for _, fields in recording.sent)
    assert (skipped["reason"], skipped["count"]) == ("paused", 12)
    assert (triggered["run_id"], triggered["how"]) == (sent.run_id, "trigger")
