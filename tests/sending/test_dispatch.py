"""Sending outside the tick (trigger, replay, backfill): rows first, then one
batched publish, then the rows marked sent; a window already stored is never
sent again from here."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from celery_routines.errors import InvalidRoutine
from celery_routines.sending.dispatch import EXISTS, SEND_FAILED, SENT, dispatch
from celery_routines.sending.publish import CeleryPublisher, OutgoingRun, Publisher
from celery_routines.store import NewRun, Store
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published
from tests.operators import add_routine, set_columns

WINDOW = datetime(2026, 11, 30, 11, 55, tzinfo=UTC)


def run(record_id: int, key: str, run_id: str) -> NewRun:
    return NewRun(
        id=run_id, routine_id=record_id, idempotency_key=key, attempt=1, scheduled_for=WINDOW
    )


def test_new_rows_are_sent_and_a_stored_window_is_not_sent_again(
    store: Store, database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    record = add_routine(store, "report")
    publisher = CeleryPublisher(filesystem_app(tmp_path, database_url))
    try:
        first = dispatch(
            store, publisher, record, [run(record.id, "report@a", "r1")], clock, 60, None
        )
        again = dispatch(
            store, publisher, record, [run(record.id, "report@a", "r2")], clock, 60, None
        )
    finally:
        publisher.close()
    assert [d.outcome for d in first] == [SENT]
    assert (again[0].outcome, again[0].existing_id, again[0].existing_state) == (
        EXISTS,
        "r1",
        "sent",
    )
    assert [m["id"] for m in published(tmp_path)] == ["r1"]
    assert store.runs.get("r1").state == "sent"


def test_a_broker_that_fails_fails_the_rest_at_once_and_each_is_recorded(
    store: Store, clock: FakeClock
) -> None:
    calls: list[list[str]] = []

    class Down(Publisher):
        def publish(self, run: OutgoingRun) -> None:
            raise ConnectionError("broker down")

        def publish_many(self, runs: list[OutgoingRun]) -> list[Exception | None]:
            calls.append([r.run_id for r in runs])
            return [ConnectionError("broker down") for _ in runs]

        def close(self) -> None:
            pass

    record = add_routine(store, "report")
    rows = [run(record.id, f"report@{i}", f"r{i}") for i in range(3)]
    results = dispatch(store, Down(), record, rows, clock, 60, None)
    assert calls == [["r0", "r1", "r2"]]  # one publish call for the batch
    assert [d.outcome for d in results] == [SEND_FAILED] * 3
    assert all("broker down" in (d.error or "") for d in results)
    assert {store.runs.get(f"r{i}").reason for i in range(3)} == {"send_failed"}


def test_an_invalid_row_writes_and_sends_nothing(store: Store, clock: FakeClock) -> None:
    record = add_routine(store, "report")
    set_columns(store, "report", catch_up_cap=0)
    record = store.routines.by_id(record.id)
    with pytest.raises(InvalidRoutine, match="catch_up_cap"):
        dispatch(store, None, record, [run(record.id, "report@a", "r1")], clock, 60, None)  # type: ignore[arg-type]
    assert store.runs.get("r1") is None
