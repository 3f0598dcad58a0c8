"""Edits made outside the code (plain SQL) take effect exactly once: a new
schedule is recomputed from now and the stale window never fires, enabling is
a resume, and an idle beat sees the change within routines_refresh_seconds
while an idle tick stays one statement."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

from celery_routines import Scheduler
from tests.conftest import FakeClock
from tests.harness import filesystem_app, insert_routine, published, runs_for


def beat(folder: Path, url: str, clock: FakeClock, **conf: Any) -> Scheduler:
    return Scheduler(filesystem_app(folder, url, **conf), clock=clock)


def sql(scheduler: Scheduler, statement: str) -> None:
    with scheduler.store.engine.begin() as conn:
        conn.execute(text(statement))


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 11, 30, hour, minute, second, tzinfo=UTC)


def test_a_schedule_changed_by_sql_is_noticed_at_the_claim_and_the_stale_window_never_fires(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "broker"
    # A refresh probe far apart: only the claim can notice the change here.
    scheduler = beat(folder, database_url, clock, routines_refresh_seconds=86_400)
    try:
        insert_routine(scheduler.store, "hourly", cron="0 * * * *", overlap="overlap")
        scheduler.tick()
        assert scheduler.store.routines.by_name("hourly").next_run_at == at(13, 0)  # type: ignore[union-attr]
        sql(scheduler, "UPDATE routines SET cron = '30 * * * *' WHERE name = 'hourly'")
        clock.now = at(13, 0, 1)
        report_sleep = scheduler.tick()
        assert report_sleep >= 0
        assert published(folder) == []  # 13:00 was computed from the old cron
        record = scheduler.store.routines.by_name("hourly")
        assert record is not None and record.next_run_at == at(13, 30)
        assert record.locked_by is None and not record.schedule_changed
        clock.now = at(13, 30, 1)
        scheduler.tick()
        assert [m["routine_window"] for m in published(folder)] == [
            "hourly@2026-11-30T13:30:00+00:00"
        ]
    finally:
        scheduler.close()


def test_the_refresh_probe_sees_an_earlier_schedule_within_refresh_seconds(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    scheduler = beat(tmp_path / "broker", database_url, clock)
    try:
        insert_routine(scheduler.store, "poll", cron="0 * * * *")
        scheduler.tick()
        sql(scheduler, "UPDATE routines SET cron = '*/10 * * * *' WHERE name = 'poll'")
        clock.advance(seconds=2)
        scheduler.tick()  # within routines_refresh_seconds of the last refresh: not asked
        assert scheduler.store.routines.by_name("poll").next_run_at == at(13, 0)  # type: ignore[union-attr]
        clock.advance(seconds=5)
        assert scheduler.tick() <= 5
        assert scheduler.store.routines.by_name("poll").next_run_at == at(12, 10)  # type: ignore[union-attr]
    finally:
        scheduler.close()


def test_enabling_by_sql_resumes_with_one_skipped_row_not_a_burst(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "broker"
    scheduler = beat(folder, database_url, clock)
    try:
        routine_id = insert_routine(scheduler.store, "poll", cron="*/10 * * * *")
        scheduler.tick()  # next window 12:10
        sql(scheduler, "UPDATE routines SET enabled = false WHERE name = 'poll'")
        clock.advance(seconds=10)
        scheduler.tick()  # the refresh notes the disable
        clock.now = at(13, 31)
        sql(scheduler, "UPDATE routines SET enabled = true WHERE name = 'poll'")
        scheduler.tick()
        assert published(folder) == []
        (skip,) = runs_for(scheduler.store, routine_id)
        assert (skip.state, skip.reason, skip.skipped_count) == ("skipped", "disabled", 9)
        assert scheduler.store.routines.by_name("poll").next_run_at == at(13, 40)  # type: ignore[union-attr]
    finally:
        scheduler.close()


def test_args_changed_by_sql_apply_to_the_next_window(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "broker"
    scheduler = beat(folder, database_url, clock)
    try:
        insert_routine(scheduler.store, "poll", cron="*/10 * * * *", overlap="overlap")
        scheduler.tick()
        sql(scheduler, """UPDATE routines SET kwargs = '{"size": 7}' WHERE name = 'poll'""")
        clock.now = at(12, 10, 1)
        scheduler.tick()
        (message,) = published(folder)
        assert "'size': 7" in message["kwargsrepr"]
    finally:
        scheduler.close()


def test_an_idle_tick_that_asks_for_changes_is_still_one_statement(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    scheduler = beat(tmp_path / "broker", database_url, clock)
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append(statement.split(None, 1)[0].upper())

    try:
        insert_routine(scheduler.store, "poll", cron="0 * * * *")
        scheduler.tick()
        clock.advance(seconds=30)  # past routines_refresh_seconds: this probe asks
        event.listen(scheduler.store.engine, "before_cursor_execute", record)
        scheduler.tick()
        assert [s for s in statements if s not in ("BEGIN", "COMMIT")] == ["SELECT"]
        assert scheduler.engine.refresher.last == clock.now
    finally:
        event.remove(scheduler.store.engine, "before_cursor_execute", record)
        scheduler.close()


def test_rows_inserted_with_their_own_window_are_fingerprinted_in_one_statement(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """SQL rows that bring their own next_run_at keep it, and are baselined
    together: one UPDATE per row cost a 10,000-routine burst a third of its
    time. Nothing fires early or twice."""
    folder = tmp_path / "broker"
    scheduler = beat(folder, database_url, clock)
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append(statement)

    try:
        for n in range(40):
            insert_routine(scheduler.store, f"r{n}", cron="0 * * * *", next_run_at=at(14, 0))
        event.listen(scheduler.store.engine, "before_cursor_execute", record)
        scheduler.tick()
        fingerprinting = [s for s in statements if "SET schedule_fingerprint" in s]
        assert len(fingerprinting) == 1
        records = [scheduler.store.routines.by_name(f"r{n}") for n in range(40)]
        assert all(r is not None and r.schedule_fingerprint for r in records)
        assert {r.next_run_at for r in records if r is not None} == {at(14, 0)}
        assert published(folder) == []
        clock.now = at(14, 0, 1)
        scheduler.tick()
        assert len(published(folder)) == 40
    finally:
        event.remove(scheduler.store.engine, "before_cursor_execute", record)
        scheduler.close()


def test_a_large_baseline_goes_in_slices_after_which_changes_are_seen(
    database_url: str, tmp_path: Path, clock: FakeClock, monkeypatch: Any
) -> None:
    """A million rows without a fingerprint, baselined in one UPDATE, held a
    fresh beat 20 s before its first send: a tick fingerprints one slice,
    sends what is due, and the next tick follows at once until the pass is
    over; only then are changed routines listed (the claim checks each
    routine it takes meanwhile)."""
    import celery_routines.tick.refresh as refresh

    monkeypatch.setattr(refresh, "BASELINE_SLICE", 10)
    folder = tmp_path / "broker"
    scheduler = beat(folder, database_url, clock)
    written: list[int] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        if "SET schedule_fingerprint" in statement:
            written.append(cursor.rowcount)

    try:
        for n in range(40):
            insert_routine(scheduler.store, f"r{n}", cron="0 * * * *", next_run_at=at(14, 0))
        insert_routine(scheduler.store, "due", cron="0 12 * * *", next_run_at=at(12, 0))
        event.listen(scheduler.store.engine, "after_cursor_execute", record)
        sleeps = [scheduler.tick()]
        assert [m["routine_window"] for m in published(folder)] == ["due@2026-11-30T12:00:00+00:00"]
        assert written == [10] and sleeps == [0.0]
        while scheduler.engine.refresher.baselining and len(sleeps) < 10:
            sleeps.append(scheduler.tick())
        assert written == [10, 10, 10, 10, 1]
        assert sleeps[:-1] == [0.0] * 4 and sleeps[-1] > 0
        sql(scheduler, "UPDATE routines SET cron = '*/10 * * * *' WHERE name = 'r3'")
        clock.advance(seconds=6)
        scheduler.tick()
        assert scheduler.store.routines.by_name("r3").next_run_at == at(12, 10)  # type: ignore[union-attr]
        records = [scheduler.store.routines.by_name(f"r{n}") for n in range(40)]
        assert all(r is not None and r.schedule_fingerprint for r in records)
    finally:
        event.remove(scheduler.store.engine, "after_cursor_execute", record)
        scheduler.close()
