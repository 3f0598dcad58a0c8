"""A beat's heartbeat row (issue 33, item 4), written by a real Scheduler's
ticks: at most one statement on a tick, none on the ticks in between, and a
failing write never stops a tick."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, update

from celery_routines import Scheduler, __version__, register
from celery_routines.sending import offload
from celery_routines.store import Store
from celery_routines.store.models import metadata
from celery_routines.tick.heartbeat import BeatHeartbeat, percentile
from celery_routines.tick.prune import Pruner
from tests.conftest import FakeClock
from tests.harness import filesystem_app


def tick_statements(scheduler: Scheduler) -> list[str]:
    """The statements one tick ran, by verb (transaction control left out)."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement.split(None, 1)[0].upper())

    event.listen(scheduler.store.engine, "before_cursor_execute", record)
    try:
        scheduler.tick()
    finally:
        event.remove(scheduler.store.engine, "before_cursor_execute", record)
    return [verb for verb in seen if verb not in ("BEGIN", "COMMIT", "ROLLBACK")]


def heartbeat_of(scheduler: Scheduler) -> BeatHeartbeat:
    heartbeat = scheduler._beat_heartbeat
    assert heartbeat is not None, "the tick wrote no heartbeat"
    return heartbeat


@pytest.fixture
def beat(tmp_path: Path, database_url: str) -> Any:
    register("tasks.yearly", "0 0 1 1 *", name="yearly")
    scheduler = Scheduler(filesystem_app(tmp_path / "broker", database_url))
    yield scheduler
    scheduler.close()


def test_a_tick_writes_the_beats_row_with_one_upsert_at_most_once_per_period(
    beat: Scheduler,
) -> None:
    beat.tick()  # adopts "yearly", writes the first heartbeat
    [row] = beat.store.beats.recent()
    assert row.beat_id == beat.holder
    assert row.pid > 0 and row.host and row.version == __version__
    assert row.ticks_measured == 1 and row.tick_p50_ms is not None
    # Not yet due: an idle tick stays its probe alone.
    assert tick_statements(beat) == ["SELECT"]
    # Due (routines_refresh_seconds later on the monotonic clock): the probe
    # plus exactly one statement, the upsert.
    heartbeat_of(beat).next_write = 0.0
    assert tick_statements(beat) == ["SELECT", "INSERT"]
    [row] = beat.store.beats.recent()
    assert row.ticks_measured == 3
    assert row.claims_held == 0
    # A live beat is stale after three of its longest heartbeat gaps:
    # (5 s sleep at most + 5 s between writes) x 3.
    assert row.stale_after_seconds == 30.0
    assert abs(row.clock_skew_seconds) < 5


def test_a_failing_heartbeat_never_stops_a_tick_and_warns_once_per_outage(
    beat: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    beat.tick()
    beats_table = beat.store.beats.table
    beats_table.drop(beat.store.engine)
    try:
        with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
            for _ in range(3):
                heartbeat_of(beat).next_write = 0.0
                assert beat.tick() > 0  # the tick ends normally, a sleep
            assert beat.last_report is not None
    finally:
        metadata.create_all(beat.store.engine, tables=[beats_table])
    warnings = [r for r in caplog.records if "heartbeat" in r.getMessage()]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        heartbeat_of(beat).next_write = 0.0
        beat.tick()
    assert "heartbeat is written again" in caplog.text
    assert [row.beat_id for row in beat.store.beats.recent()] == [beat.holder]


def test_the_tick_percentiles_are_nearest_rank_over_the_recent_ticks() -> None:
    values = sorted(float(n) for n in range(1, 101))
    assert (percentile(values, 0.5), percentile(values, 0.99)) == (50.0, 99.0)
    assert percentile([7.0], 0.99) == 7.0


def test_the_pulse_reports_milliseconds_over_a_bounded_window(clock: FakeClock) -> None:
    heartbeat = BeatHeartbeat(
        None,  # type: ignore[arg-type]  # pulse() writes nothing
        "h:1:x",
        clock,
        every=5,
        longest_sleep=5,
        publish_processes=0,
        version="v",
    )
    for _ in range(2000):
        heartbeat.durations.append(0.001)
    heartbeat.durations.append(0.5)
    pulse = heartbeat.pulse()
    assert pulse.ticks_measured == 1000  # the window, not every tick ever
    assert (pulse.tick_p50_ms, pulse.tick_p99_ms) == (pytest.approx(1.0), pytest.approx(1.0))
    assert pulse.started_at == clock.now
    assert pulse.stale_after_seconds == 30.0


def test_beats_rows_gone_for_a_day_go_with_the_prune_pass(beat: Scheduler) -> None:
    beat.tick()
    store = beat.store
    table = store.beats.table
    store.beats.beat(pulse_of(beat, "gone:1:x"), beat._clock())
    with store.engine.begin() as conn:
        conn.execute(
            update(table)
            .where(table.c.beat_id == "gone:1:x")
            .values(last_tick_at=datetime.now(UTC) - timedelta(days=1, minutes=5))
        )
    minutes = iter([0.0, 61.0, 61.0])  # built, then a minute later: a pass is due
    pruner = Pruner(store, 30, 100, "UTC", monotonic=lambda: next(minutes))
    assert pruner.maybe_prune(datetime.now(UTC)) is not None
    assert [row.beat_id for row in store.beats.recent(within=timedelta(days=7))] == [beat.holder]


def pulse_of(beat: Scheduler, beat_id: str) -> Any:
    return replace(heartbeat_of(beat).pulse(), beat_id=beat_id)


def test_a_beat_that_stops_cleanly_leaves_the_beats_page_and_only_its_own_row(
    tmp_path: Path, database_url: str
) -> None:
    register("tasks.yearly", "0 0 1 1 *", name="yearly")
    stopping = Scheduler(filesystem_app(tmp_path / "broker", database_url))
    stopping.tick()
    # Another beat, still running.
    stopping.store.beats.beat(pulse_of(stopping, "other-host:1:x"), stopping._clock())
    stopping.close()
    # Read on a store of its own: the closed beat disposed of its engine.
    left = Store.from_url(database_url)
    try:
        assert [row.beat_id for row in left.beats.recent()] == ["other-host:1:x"]
    finally:
        left.dispose()


def test_a_beat_embedded_in_a_worker_shows_no_publishing_process(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`celery worker -B` ignores routines_publish_processes (it publishes in
    its own process): the Beats page said the configured number."""
    app = filesystem_app(tmp_path / "broker", database_url)
    app.conf.routines_publish_processes = 2
    monkeypatch.setattr(offload, "_embedded_in_a_worker", True)
    scheduler = Scheduler(app)
    try:
        assert heartbeat_of(scheduler).publish_processes == 0
    finally:
        scheduler.close()
    monkeypatch.setattr(offload, "_embedded_in_a_worker", False)
    assert offload.publishing_processes(scheduler.settings) == 2
