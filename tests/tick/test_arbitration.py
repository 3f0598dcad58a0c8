"""Issue 18, item 2 in process: windows follow the beat's clock, claims and
run deadlines the database's (the engine's ``arbiter``; here an injected
clock standing in for the database's). The same with real beats under
libfaketime is in tests/faults/test_clock_arbitration_real.py."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest

from celery_routines import Scheduler, register
from celery_routines.sending.publish import OutgoingRun, PendingErrors
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published, runs_of

TIMEOUT = 600


def beat_ten_minutes_fast(
    tmp_path: Path, database_url: str, db: FakeClock
) -> tuple[Scheduler, FakeClock]:
    register("tasks.poll", timedelta(hours=1), name="poll")
    clock = FakeClock(db.now + timedelta(minutes=10))
    app = filesystem_app(tmp_path / "broker", database_url, routines_run_timeout=TIMEOUT)
    scheduler = Scheduler(app, clock=clock)
    scheduler.engine.arbiter = db
    return scheduler, clock


def first_window_sent(
    tmp_path: Path, database_url: str, db: FakeClock
) -> tuple[Scheduler, FakeClock]:
    """The fast beat adopts the routine (first window an hour after its own
    now), then both clocks move an hour and it sends that window."""
    beat, fast = beat_ten_minutes_fast(tmp_path, database_url, db)
    beat.tick()
    fast.advance(hours=1)
    db.advance(hours=1)
    beat.tick()
    return beat, fast


def test_claims_and_run_deadlines_are_written_on_the_databases_clock(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    db = clock
    beat, fast = first_window_sent(tmp_path, database_url, db)
    try:
        [row] = runs_of(beat.store, "poll")
        run = beat.store.runs.get(row["id"])
        assert run.state == "sent"
        assert run.scheduled_for == fast.now  # the window: the beat's clock
        assert run.deadline_at == db.now + timedelta(seconds=TIMEOUT)  # the database's
        assert abs(beat.engine.offset + timedelta(minutes=10)) < timedelta(seconds=1)
    finally:
        beat.close()


def test_a_beat_clock_jump_longer_than_the_timeout_declares_no_run_lost(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    db = clock
    beat, fast = first_window_sent(tmp_path, database_url, db)
    try:
        fast.advance(seconds=3 * TIMEOUT)  # the beat's clock jumps; the database's does not
        beat.tick()
        first = runs_of(beat.store, "poll")[0]
        assert first["state"] == "sent", first
        db.advance(seconds=TIMEOUT + 1)  # now it has been silent for the timeout
        beat.engine.sweeps._last_lost_sweep = None
        beat.tick()
        assert runs_of(beat.store, "poll")[0]["reason"] == "lost"
        assert published(tmp_path / "broker")
    finally:
        beat.close()


def test_a_clock_stepped_back_mid_tick_declares_no_run_lost(
    tmp_path: Path, database_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NTP steps the beat's clock back an hour between writing a tick's rows
    and publishing them. The tick measured the database's clock against the
    beat's before the step, so the send instant it reads after the step is an
    hour early on the database's clock: marking the run sent must not move
    its lost deadline back by that hour (the run would be declared lost at
    once and sent again as attempt 2: a window twice)."""
    db = clock
    beat, fast = beat_ten_minutes_fast(tmp_path, database_url, db)
    try:
        beat.tick()
        fast.advance(hours=1)
        db.advance(hours=1)
        publisher = beat.engine.publisher
        begin = publisher.begin_publish_many

        def stepped_back_then_published(runs: Sequence[OutgoingRun]) -> PendingErrors:
            fast.advance(hours=-1)
            return begin(runs)

        with monkeypatch.context() as patched:
            patched.setattr(publisher, "begin_publish_many", stepped_back_then_published)
            beat.tick()
        [row] = runs_of(beat.store, "poll")
        run = beat.store.runs.get(row["id"])
        assert run.state == "sent"
        assert run.deadline_at == db.now + timedelta(seconds=TIMEOUT)
        db.advance(seconds=10)
        fast.advance(hours=1, seconds=10)
        beat.engine.sweeps._last_lost_sweep = None
        beat.tick()
        assert [r["attempt"] for r in runs_of(beat.store, "poll")] == [1]
        assert runs_of(beat.store, "poll")[0]["state"] == "sent"
    finally:
        beat.close()


def test_in_production_the_idle_probe_reads_the_database_clock_itself(
    tmp_path: Path, database_url: str
) -> None:
    """Beat on the real clock arbitrates on the database's: the probe returns
    that clock as a column, so an idle tick stays one statement (a separate
    ``SELECT now()`` made it two) and the offset is still measured."""
    from sqlalchemy import event

    register("tasks.yearly", "0 0 1 1 *", name="yearly")
    scheduler = Scheduler(filesystem_app(tmp_path / "broker", database_url))
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append(statement)

    try:
        scheduler.tick()  # adopts
        scheduler.engine.offset = timedelta(hours=5)  # stale: the probe corrects it
        event.listen(scheduler.store.engine, "before_cursor_execute", record)
        scheduler.tick()
        verbs = [s.split(None, 1)[0].upper() for s in statements]
        if scheduler.store.engine.dialect.name == "sqlite":
            verbs = [verb for verb in verbs if verb != "BEGIN"]  # pysqlite's own
        assert verbs == ["SELECT"]
        assert abs(scheduler.engine.offset) < timedelta(seconds=5)
        if scheduler.store.engine.dialect.name != "sqlite":
            # The database's clock, read by the probe (SQLite has none).
            assert "timestamp" in statements[0].lower()
    finally:
        event.remove(scheduler.store.engine, "before_cursor_execute", record)
        scheduler.close()
