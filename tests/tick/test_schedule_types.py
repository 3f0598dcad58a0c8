"""One-off, starts_at/ends_at, jitter and message expiry through real ticks
(SQLite, PostgreSQL and MariaDB stores, an injected clock, a filesystem broker)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

from celery_routines import Scheduler, register
from celery_routines.operator.views import routine_state
from celery_routines.schedules.base import NEVER
from celery_routines.schedules.jitter import jitter_offset
from tests.conftest import FakeClock
from tests.harness import filesystem_app, insert_routine, published, runs_for


def make(tmp_path: Path, database_url: str, clock: FakeClock) -> Scheduler:
    return Scheduler(filesystem_app(tmp_path / "broker", database_url), clock=clock)


def rows(scheduler: Scheduler, name: str):
    record = scheduler.store.routines.by_name(name)
    return sorted(runs_for(scheduler.store, record.id), key=lambda r: r.scheduled_for)


def keys(tmp_path: Path) -> list[str]:
    """The window keys sent, leaving out Celery's own backend clean-up entry."""
    sent = [m["routine_window"] for m in published(tmp_path / "broker")]
    return [key for key in sent if not key.startswith("celery.")]


def test_a_one_off_fires_once_then_the_routine_is_done(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    at = clock.now + timedelta(minutes=5)
    register("tasks.remind", name="remind", at=at.isoformat())
    beat = make(tmp_path, database_url, clock)
    try:
        beat.tick()
        clock.advance(minutes=4, seconds=59)
        beat.tick()
        assert keys(tmp_path) == []
        clock.advance(seconds=1)
        beat.tick()
        assert keys(tmp_path) == [f"remind@{at.isoformat()}"]
        record = beat.store.routines.by_name("remind")
        assert record.next_run_at == NEVER
        assert routine_state(record, clock.now) == "done"
        clock.advance(days=400)
        beat.tick()
        # No second window: whatever goes out again (the lost run's retry) is the same window.
        sent = [m for m in published(tmp_path / "broker") if m["routine"] == "remind"]
        assert {m["routine_window"] for m in sent} == {f"remind@{at.isoformat()}"}
        assert {r.idempotency_key for r in rows(beat, "remind")} == {f"remind@{at.isoformat()}"}
    finally:
        beat.close()


def test_a_one_off_missed_while_beat_was_down_fires_on_recovery_unless_too_late(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    at = clock.now + timedelta(minutes=1)
    register("tasks.remind", name="soon", at=at, max_lateness=600)
    register("tasks.remind", name="stale", at=at, max_lateness=60)
    beat = make(tmp_path, database_url, clock)
    try:
        beat.tick()
        clock.advance(minutes=6)  # beat was down from 12:00 to 12:06
        beat.tick()
        assert keys(tmp_path) == [f"soon@{at.isoformat()}"]
        [skip] = rows(beat, "stale")
        assert (skip.state, skip.reason, skip.skipped_count) == ("skipped", "late", 1)
        for name in ("soon", "stale"):
            assert beat.store.routines.by_name(name).next_run_at == NEVER
    finally:
        beat.close()


def test_a_one_off_row_inserted_after_its_instant_still_fires_once(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    beat = make(tmp_path, database_url, clock)
    try:
        insert_routine(
            beat.store, "late-row", at=(clock.now - timedelta(hours=1)).replace(tzinfo=None)
        )
        beat.tick()
        beat.tick()
        assert keys(tmp_path) == ["late-row@2026-11-30T11:00:00+00:00"]
        assert beat.store.routines.by_name("late-row").next_run_at == NEVER
    finally:
        beat.close()


def test_catch_up_never_replays_a_window_outside_starts_at_and_ends_at(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    start = clock.now + timedelta(minutes=2)
    end = clock.now + timedelta(minutes=4)
    register(
        "tasks.poll", "* * * * *", name="bounded", starts_at=start, ends_at=end, overlap="overlap"
    )
    beat = make(tmp_path, database_url, clock)
    try:
        beat.tick()
        assert beat.store.routines.by_name("bounded").next_run_at == start
        clock.advance(minutes=30)  # down through the whole span and beyond
        beat.tick()
        assert sorted(keys(tmp_path)) == [
            f"bounded@{(start + timedelta(minutes=m)).isoformat()}" for m in (0, 1, 2)
        ]
        record = beat.store.routines.by_name("bounded")
        assert record.next_run_at == NEVER and routine_state(record, clock.now) == "done"
    finally:
        beat.close()


def _jittered_name(low: int, high: int) -> str:
    return next(
        f"spread-{i}"
        for i in range(1000)
        if timedelta(seconds=low) < jitter_offset(f"spread-{i}", 600) < timedelta(seconds=high)
    )


def test_a_jittered_window_goes_out_at_its_offset_under_its_nominal_key(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    name = _jittered_name(120, 500)
    offset = jitter_offset(name, 600)
    register("tasks.poll", "0 * * * *", name=name, jitter=600)
    beat = make(tmp_path, database_url, clock)
    window = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
    try:
        beat.tick()
        assert beat.store.routines.by_name(name).next_run_at == window + offset
        clock.now = window + offset - timedelta(seconds=1)
        beat.tick()
        assert keys(tmp_path) == []
        clock.now = window + offset
        beat.tick()
        assert keys(tmp_path) == [f"{name}@{window.isoformat()}"]
        [run] = rows(beat, name)
        assert run.scheduled_for == window
        next_window = window + timedelta(hours=1)
        assert beat.store.routines.by_name(name).next_run_at == next_window + offset
    finally:
        beat.close()


def test_lateness_of_a_jittered_window_is_measured_from_its_send_instant(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    name = _jittered_name(120, 500)
    offset = jitter_offset(name, 600)
    register("tasks.poll", "0 * * * *", name=name, jitter=600, max_lateness=60)
    beat = make(tmp_path, database_url, clock)
    window = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
    try:
        beat.tick()
        # Long after the nominal window, but only 30 s after its send instant: sent.
        clock.now = window + offset + timedelta(seconds=30)
        beat.tick()
        assert keys(tmp_path) == [f"{name}@{window.isoformat()}"]
        clock.now = window + timedelta(hours=1) + offset + timedelta(seconds=90)
        beat.tick()
        assert len(keys(tmp_path)) == 1
        assert [r.reason for r in rows(beat, name) if r.state == "skipped"] == ["late"]
    finally:
        beat.close()


def test_a_window_of_a_routine_with_max_lateness_carries_expires(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    register("tasks.poll", "* * * * *", name="fresh", max_lateness=45)
    register("tasks.poll", "* * * * *", name="whenever")
    beat = make(tmp_path, database_url, clock)
    try:
        beat.tick()
        clock.advance(minutes=1)
        beat.tick()
        expires = {m["routine"]: m["expires"] for m in published(tmp_path / "broker")}
        window = datetime(2026, 11, 30, 12, 1, tzinfo=UTC)
        assert datetime.fromisoformat(expires["fresh"]) == window + timedelta(seconds=45)
        assert expires["whenever"] is None
    finally:
        beat.close()


def test_an_rrule_row_fires_its_local_times_until_its_count_is_used_then_is_done(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    beat = make(tmp_path, database_url, clock)
    rule = "DTSTART:20261130T133000\nRRULE:FREQ=DAILY;COUNT=2"
    try:
        insert_routine(beat.store, "daily", rrule=rule, timezone="Europe/Rome", overlap="overlap")
        beat.tick()
        clock.advance(days=3)  # both windows were missed: catch_up replays them
        beat.tick()
        assert sorted(keys(tmp_path)) == [
            "daily@2026-11-30T13:30:00+01:00",
            "daily@2026-12-01T13:30:00+01:00",
        ]
        assert beat.store.routines.by_name("daily").next_run_at == NEVER
    finally:
        beat.close()


def test_a_jittered_routine_enabled_again_by_sql_skips_its_nominal_windows(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    name = _jittered_name(120, 500)
    offset = jitter_offset(name, 600)
    beat = make(tmp_path, database_url, clock)
    try:
        insert_routine(beat.store, name, cron="0 * * * *", jitter_seconds=600)
        beat.tick()
        with beat.store.engine.begin() as conn:
            conn.execute(text("UPDATE routines SET enabled = false"))
        clock.advance(seconds=10)
        beat.tick()
        clock.now = datetime(2026, 11, 30, 15, 0, tzinfo=UTC)  # 13:00 and 14:00 missed
        with beat.store.engine.begin() as conn:
            conn.execute(text("UPDATE routines SET enabled = true"))
        beat.tick()
        [skip] = rows(beat, name)
        assert (skip.reason, skip.skipped_count, skip.skipped_first, skip.skipped_last) == (
            "disabled",
            2,
            datetime(2026, 11, 30, 13, 0, tzinfo=UTC),
            datetime(2026, 11, 30, 14, 0, tzinfo=UTC),
        )
        next_window = datetime(2026, 11, 30, 15, 0, tzinfo=UTC)
        assert beat.store.routines.by_name(name).next_run_at == next_window + offset
        assert keys(tmp_path) == []
    finally:
        beat.close()


def test_a_bound_set_by_sql_reschedules_the_routine_from_now(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    beat = make(tmp_path, database_url, clock)
    try:
        insert_routine(beat.store, "later", cron="* * * * *")
        beat.tick()
        assert beat.store.routines.by_name("later").next_run_at == clock.now + timedelta(minutes=1)
        with beat.store.engine.begin() as conn:
            conn.execute(text("UPDATE routines SET starts_at = '2026-11-30 13:00:00'"))
        clock.advance(seconds=10)
        beat.tick()
        record = beat.store.routines.by_name("later")
        assert record.next_run_at == datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
        clock.advance(minutes=5)
        beat.tick()
        assert keys(tmp_path) == []
    finally:
        beat.close()


def test_a_long_rrule_fits_the_schedule_fingerprint(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    days = ",".join(str(day) for day in range(1, 366, 2))
    rule = f"DTSTART:20260101T090000\nRRULE:FREQ=YEARLY;BYYEARDAY={days}"
    assert len(rule) > 400
    beat = make(tmp_path, database_url, clock)
    try:
        insert_routine(beat.store, "odd-days", rrule=rule)
        beat.tick()
        clock.advance(seconds=10)
        beat.tick()
        record = beat.store.routines.by_name("odd-days")
        assert record.last_error is None and record.schedule_fingerprint.endswith("|on")
        assert record.next_run_at == datetime(2026, 12, 1, 9, 0, tzinfo=UTC)  # day 335
    finally:
        beat.close()


def test_a_notify_url_set_by_sql_is_not_a_schedule_change(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    """Like pause_after_failures (and unlike exclude/shift), where a person is
    told moves no window: the fingerprint does not spell it."""
    beat = make(tmp_path, database_url, clock)
    try:
        insert_routine(beat.store, "hourly", cron="0 * * * *")
        beat.tick()
        before = beat.store.routines.by_name("hourly")
        with beat.store.engine.begin() as conn:
            conn.execute(text("UPDATE routines SET notify_url = 'https://hooks.example.com/x'"))
        record = beat.store.routines.by_name("hourly")
        assert record.notify_url == "https://hooks.example.com/x"
        assert not record.schedule_changed
        assert record.schedule_fingerprint == before.schedule_fingerprint
        clock.advance(seconds=10)
        beat.tick()
        assert beat.store.routines.by_name("hourly").next_run_at == before.next_run_at
        with beat.store.engine.begin() as conn:  # the contrast: a calendar column counts
            conn.execute(text("UPDATE routines SET shift = 'next_business_day'"))
        assert beat.store.routines.by_name("hourly").schedule_changed
    finally:
        beat.close()
