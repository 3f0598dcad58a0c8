"""Issue 5, scenario 7: beat's wall clock steps back or jumps forward.

Injected at the Scheduler (``Scheduler(app, clock=...)``), and beat driven as
``celery beat`` drives it: sleep what ``tick()`` returns, so a hot loop shows
as a tick count and a stall as a window never sent.

Stepped back an hour: every routine's ``next_run_at`` is now an hour ahead
of the clock, so beat sends nothing until its clock reaches the window after
the last one it sent, and then carries on; nothing is sent twice, nothing is
skipped. Windows planned again over the repeated hour (a routine adopted
again, as after its definition changed) find their run rows already written
(the unique key) and are not sent again.

Jumped forward an hour: the windows in the jump are missed windows, and each
routine's ``catch_up`` policy decides (capped replay, latest, or none, with
one summary row). If the clock is then corrected back, the windows replayed
in the jump are not sent again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

from celery_routines import Scheduler, register
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published, runs_for, runs_of

MAX_INTERVAL = 5


def make_scheduler(
    folder: Path, database_url: str, clock: Callable[[], datetime], **conf: object
) -> Scheduler:
    app = filesystem_app(folder, database_url, beat_max_loop_interval=MAX_INTERVAL, **conf)
    return Scheduler(app, clock=clock)


def run_beat_until(scheduler: Scheduler, clock: FakeClock, end: datetime) -> int:
    """Tick and sleep what the tick asks until ``end``; the number of ticks."""
    ticks = 0
    while clock.now < end:
        sleep = scheduler.tick()
        ticks += 1
        assert 0 < sleep <= MAX_INTERVAL, f"tick at {clock.now} asked to sleep {sleep}"
        clock.advance(seconds=sleep)
    return ticks


def sent_keys(folder: Path) -> list[str]:
    """Every window key published, sorted (message files are not in send order)."""
    return sorted(m["routine_window"] for m in published(folder))


def assert_each_once(folder: Path) -> None:
    """No (window, attempt) published twice."""
    sent = Counter((m["routine_window"], m["routine_attempt"]) for m in published(folder))
    doubled = {key: n for key, n in sent.items() if n > 1}
    assert not doubled, f"sent twice: {doubled}"
    assert {attempt for _, attempt in sent} == {1}, "a retry: no run should be lost here"


def minutely_keys(name: str, first: datetime, last: datetime) -> list[str]:
    keys, instant = [], first
    while instant <= last:
        keys.append(f"{name}@{instant.isoformat()}")
        instant += timedelta(minutes=1)
    return keys


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 11, 30, hour, minute, second, tzinfo=UTC)


def test_clock_stepped_back_an_hour_sends_no_window_twice_and_resumes(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "broker"
    # No worker here: overlap="overlap" sends every window although runs stay open.
    register("tasks.every_minute", timedelta(minutes=1), name="minutely", overlap="overlap")
    register("tasks.quarter", "*/15 * * * *", name="quarterly", overlap="overlap")
    scheduler = make_scheduler(folder, database_url, clock)
    try:
        run_beat_until(scheduler, clock, at(12, 30, 30))
        before = sent_keys(folder)
        assert len(before) == 30 + 2  # 12:01..12:30; 12:15, 12:30

        clock.now -= timedelta(hours=1)  # 11:30:30: NTP stepped the clock back
        ticks = run_beat_until(scheduler, clock, at(12, 30, 0))
        assert sent_keys(folder) == before  # the repeated hour sends nothing
        # It slept in max_interval steps through the hour: no hot loop.
        assert ticks <= 3600 // MAX_INTERVAL + 5

        run_beat_until(scheduler, clock, at(12, 45, 1))
        keys = sent_keys(folder)
        assert_each_once(folder)
        minutely = [k for k in keys if k.startswith("minutely@")]
        assert minutely == minutely_keys("minutely", at(12, 1), at(12, 45))  # no gap
        assert [k for k in keys if k.startswith("quarterly@")] == [
            "quarterly@2026-11-30T12:15:00+00:00",
            "quarterly@2026-11-30T12:30:00+00:00",
            "quarterly@2026-11-30T12:45:00+00:00",
        ]
        store = scheduler.store
        assert not [r for r in runs_of(store, "minutely") if r["state"] == "skipped"]
    finally:
        scheduler.close()


def readopt(store: Store) -> None:
    """What a changed definition does: the routine gets a new first window."""
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE routines SET next_run_at = NULL"))


def test_windows_planned_again_over_the_repeated_hour_are_not_sent_twice(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "broker"
    register("tasks.every_minute", timedelta(minutes=1), name="minutely", overlap="overlap")
    register("tasks.five", "*/5 * * * *", name="fives", overlap="overlap")
    scheduler = make_scheduler(folder, database_url, clock)
    try:
        run_beat_until(scheduler, clock, at(12, 30, 30))
        before = sent_keys(folder)
        clock.now = at(12, 0)  # stepped back half an hour, on the minute
        readopt(scheduler.store)  # both are planned again from 12:00
        run_beat_until(scheduler, clock, at(12, 40, 1))
        keys = sent_keys(folder)
        assert_each_once(folder)
        assert set(before) <= set(keys)
        assert [k for k in keys if k.startswith("minutely@")] == minutely_keys(
            "minutely", at(12, 1), at(12, 40)
        )
        assert [k for k in keys if k.startswith("fives@")] == [
            f"fives@2026-11-30T12:{m:02d}:00+00:00" for m in range(5, 45, 5)
        ]
        # Each replanned window met its own row: one row per window, never two.
        store = scheduler.store
        for name in ("minutely", "fives"):
            rows = runs_of(store, name)
            assert len(rows) == len({r["idempotency_key"] for r in rows})
    finally:
        scheduler.close()


def test_clock_jumped_forward_an_hour_follows_each_catch_up_policy(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "broker"
    for policy in ("catch_up", "latest", "skip_to_next"):
        register(
            f"tasks.{policy}",
            timedelta(minutes=1),
            name=policy,
            catch_up=policy,
            overlap="overlap",
        )
    # Runs sent before the jump stay open (no worker here); a jump past
    # routines_run_timeout would declare them lost and retry them, which is
    # what an hour of silence means. Keep that out of this test.
    scheduler = make_scheduler(folder, database_url, clock, routines_run_timeout=86400)
    try:
        run_beat_until(scheduler, clock, at(12, 10, 30))  # sent 12:01 .. 12:10
        clock.now += timedelta(hours=1)  # 13:10:30: 12:11 .. 13:10 fell in the jump
        scheduler.tick()
        store = scheduler.store

        def summary(name: str) -> list[tuple[str, int, datetime, datetime]]:
            return [
                (r.reason, r.skipped_count, r.skipped_first, r.skipped_last)
                for r in runs_for(store, store.routines.by_name(name).id)
                if r.state == "skipped"
            ]

        def sent_after(name: str, instant: datetime) -> list[str]:
            return [
                k
                for k in sent_keys(folder)
                if k.startswith(f"{name}@") and k > f"{name}@{instant.isoformat()}"
            ]

        # catch_up: the newest catch_up_cap (25) of the 60 missed windows.
        assert sent_after("catch_up", at(12, 10)) == minutely_keys(
            "catch_up", at(12, 46), at(13, 10)
        )
        assert summary("catch_up") == [("catch_up_cap", 35, at(12, 11), at(12, 45))]
        assert sent_after("latest", at(12, 10)) == ["latest@2026-11-30T13:10:00+00:00"]
        assert summary("latest") == [("latest", 59, at(12, 11), at(13, 9))]
        assert sent_after("skip_to_next", at(12, 10)) == []
        assert summary("skip_to_next") == [("skip_to_next", 60, at(12, 11), at(13, 10))]

        # Then the clock is corrected back: what went out in the jump is not
        # sent again, and each routine resumes at 13:11 by the clock.
        clock.now = at(12, 11, 0)
        run_beat_until(scheduler, clock, at(13, 15, 1))
        assert_each_once(folder)
        for name in ("catch_up", "latest", "skip_to_next"):
            assert sent_after(name, at(13, 10)) == minutely_keys(name, at(13, 11), at(13, 15))
    finally:
        scheduler.close()


def test_a_beat_whose_clock_is_an_hour_behind_another_doubles_nothing(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """Two beats, one clock an hour slow: the slow beat finds nothing due (the
    other has advanced every routine past its clock) and sends nothing twice.

    The opposite skew is the hazard to know about: a beat whose clock is
    fast sends each window as early as its clock is ahead. Nothing doubles
    (the other beat finds the rows written), but keep beat hosts on NTP.
    """
    folder = tmp_path / "broker"
    register("tasks.every_minute", timedelta(minutes=1), name="minutely", overlap="overlap")
    on_time = make_scheduler(folder, database_url, clock)
    slow = make_scheduler(folder, database_url, lambda: clock.now - timedelta(hours=1))
    try:
        on_time.tick()
        slow.tick()
        for _ in range(30 * 12):  # half an hour of ticks every 5 s, alternating
            clock.advance(seconds=5)
            (on_time if clock.now.second % 10 else slow).tick()
            slow.tick()
        on_time.tick()
        keys = sent_keys(folder)
        assert_each_once(folder)
        assert keys == minutely_keys("minutely", at(12, 1), at(12, 30))
    finally:
        on_time.close()
        slow.close()


def test_a_beat_whose_clock_is_an_hour_fast_sends_early_but_never_twice(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """The hazard named above, pinned: the fast beat treats the hour ahead of
    it as missed windows (catch-up policy) and then fires each window an hour
    early; the on-time beat finds nothing due. One run per window."""
    folder = tmp_path / "broker"
    register("tasks.every_minute", timedelta(minutes=1), name="minutely", overlap="overlap")
    on_time = make_scheduler(folder, database_url, clock)
    fast = make_scheduler(folder, database_url, lambda: clock.now + timedelta(hours=1))
    try:
        on_time.tick()  # adopts: first window 12:01
        for _ in range(30 * 12):  # half an hour of ticks every 5 s
            clock.advance(seconds=5)
            on_time.tick()
            fast.tick()
        assert_each_once(folder)
        keys = sent_keys(folder)
        # 25 of the first hour's windows replayed at once, then one a minute,
        # an hour early, up to 13:30 by the fast clock.
        assert keys == minutely_keys("minutely", at(12, 36), at(13, 30))
    finally:
        on_time.close()
        fast.close()
