"""The tick under recovery: takeover of written windows, lateness at send time,
and ceilings (the before-send check and suspension), with an injected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from celery_routines import Ceiling, Scheduler, register
from celery_routines.store import NewRun
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published, runs_for
from tests.work import ScheduleWork


def make(tmp_path: Path, database_url: str, clock, **conf) -> Scheduler:
    return Scheduler(filesystem_app(tmp_path / "broker", database_url, **conf), clock=clock)


def runs(scheduler: Scheduler, name: str):
    record = scheduler.store.routines.by_name(name)
    return sorted(runs_for(scheduler.store, record.id), key=lambda r: r.scheduled_for)


@pytest.mark.parametrize("left_state", ["pending", "sent"])
def test_a_window_written_by_a_dead_beat_is_not_also_summarised_as_skipped(
    tmp_path: Path, database_url: str, clock: FakeClock, left_state: str
) -> None:
    register("tasks.poll", timedelta(minutes=1), name="poll", catch_up="skip_to_next")
    dead = make(tmp_path, database_url, clock, routines_lock_ttl=30)
    survivor = make(tmp_path, database_url, clock, routines_lock_ttl=30)
    try:
        dead.tick()
        clock.advance(minutes=1)
        store = dead.store
        # The dead beat claimed 12:01, wrote its row, and died before advancing.
        [record] = store.routines.claim_due(clock.now, dead.holder, 30, 10)
        store.runs.insert_new(
            [
                NewRun(
                    "dead-beat-run",
                    record.id,
                    "poll@2026-11-30T12:01:00+00:00",
                    1,
                    record.next_run_at,
                )
            ],
            clock.now,
        )
        if left_state == "sent":
            store.runs.mark_sent(["dead-beat-run"], clock.now)
        clock.advance(minutes=5)  # 12:06: five more windows fell due meanwhile
        survivor.tick()
        rows = runs(survivor, "poll")
        skipped = [r for r in rows if r.state == "skipped"]
        assert [(r.skipped_count, r.skipped_first, r.skipped_last) for r in skipped] == [
            (
                5,
                datetime(2026, 11, 30, 12, 2, tzinfo=UTC),
                datetime(2026, 11, 30, 12, 6, tzinfo=UTC),
            )
        ]
        expected_ids = ["dead-beat-run"] if left_state == "pending" else []
        assert [m["id"] for m in published(tmp_path / "broker")] == expected_ids
        assert store.runs.get("dead-beat-run").state == "sent"
    finally:
        dead.close()
        survivor.close()


def test_ten_minutes_down_the_defaults_send_the_newest_window_once_and_summarise_the_rest(
    tmp_path: Path, database_url: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # No catch_up or overlap option: the defaults ("catch_up", "skip").
    register("tasks.flaky", "* * * * *", name="flaky")
    beat = make(tmp_path, database_url, clock)
    other = make(tmp_path, database_url, clock)
    try:
        beat.tick()  # adopts at 12:00: first window 12:01
        clock.advance(minutes=10, seconds=1)  # down until 12:10:01: 12:01 .. 12:10 are due
        with caplog.at_level("INFO", logger="celery_routines.beat"):
            beat.tick()
            other.tick()  # a second beat at the same instant sends nothing more
        sent = [m["routine_window"] for m in published(tmp_path / "broker")]
        assert sent == ["flaky@2026-11-30T12:10:00+00:00"]
        rows = runs(beat, "flaky")
        [skip] = [r for r in rows if r.state == "skipped"]
        assert (skip.reason, skip.skipped_count) == ("latest", 9)
        assert (skip.skipped_first, skip.skipped_last) == (
            datetime(2026, 11, 30, 12, 1, tzinfo=UTC),
            datetime(2026, 11, 30, 12, 9, tzinfo=UTC),
        )
        assert [(r.scheduled_for.minute, r.state) for r in rows if r.state != "skipped"] == [
            (10, "sent")
        ]
        assert beat.store.routines.by_name("flaky").next_run_at == datetime(
            2026, 11, 30, 12, 11, tzinfo=UTC
        )
        assert (
            "skipped 9 windows of flaky from 2026-11-30T12:01:00+00:00 to "
            "2026-11-30T12:09:00+00:00: latest (a recovery under overlap=skip sends only its "
            "newest window, flaky@2026-11-30T12:10:00+00:00)"
        ) in caplog.messages
    finally:
        beat.close()
        other.close()


def test_a_beat_taking_a_recovery_over_sends_the_window_the_dead_beat_wrote_not_a_newer_one(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    register("tasks.poll", "* * * * *", name="poll")  # the defaults: catch_up, skip
    dead = make(tmp_path, database_url, clock, routines_lock_ttl=30)
    survivor = make(tmp_path, database_url, clock, routines_lock_ttl=30)
    try:
        dead.tick()  # adopts at 12:00: first window 12:01
        clock.advance(minutes=5)
        store = dead.store
        # Back at 12:05, the dead beat claimed the recovery, wrote its newest
        # window, 12:05 (perhaps published it), and died before moving on.
        [record] = store.routines.claim_due(clock.now, dead.holder, 30, 10)
        key = "poll@2026-11-30T12:05:00+00:00"
        store.runs.insert_new([NewRun("dead-beat-run", record.id, key, 1, clock.now)], clock.now)
        clock.advance(minutes=2)  # 12:07: its claim expired; 12:06 and 12:07 fell due
        survivor.tick()
        # One body: the dead beat's run again (the worker runs it once), not 12:07 beside it.
        assert [m["id"] for m in published(tmp_path / "broker")] == ["dead-beat-run"]
        assert store.runs.get("dead-beat-run").state == "sent"
        skipped = [(r.reason, r.skipped_count) for r in runs(survivor, "poll") if r.skipped_count]
        assert skipped == [("latest", 4), ("overlap", 2)]  # 12:01 .. 12:04; 12:06, 12:07
        assert store.routines.by_name("poll").next_run_at == datetime(
            2026, 11, 30, 12, 8, tzinfo=UTC
        )
    finally:
        dead.close()
        survivor.close()


class TickingClock(FakeClock):
    """Every read of the clock costs a second: a slow drain, without sleeping."""

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def test_max_lateness_is_judged_at_send_time_behind_a_backlog(
    tmp_path: Path, database_url: str
) -> None:
    clock = TickingClock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))
    for i in range(12):
        register("tasks.report", "5 12 * * *", name=f"report-{i}", max_lateness=6)
    scheduler = make(tmp_path, database_url, clock)
    try:
        scheduler.tick()
        clock.now = datetime(2026, 11, 30, 12, 5, tzinfo=UTC)
        scheduler.tick()  # planned at 12:05:01, well inside max_lateness
        states = [r.state for i in range(12) for r in runs(scheduler, f"report-{i}")]
        late = [r for i in range(12) for r in runs(scheduler, f"report-{i}") if r.reason == "late"]
        sent = len(published(tmp_path / "broker"))
        assert sent > 0 and late, states
        assert sent + len(late) == 12
        assert all(r.state == "skipped" and r.skipped_count == 1 for r in late)
    finally:
        scheduler.close()


def test_a_ceiling_reached_suspends_until_the_next_local_day_and_resumes_by_itself(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    # 12:00 UTC is 13:00 in Rome; the day turns at 23:00 UTC.
    # overlap="overlap": no worker runs here, so every run stays open; under
    # the default skip only the first window would go out, and since issue 28
    # the lost run's retry waits for the open run (skip never runs two bodies
    # at once: tests/tick/test_sweeps.py), so the ceiling would not be reached
    # by fires at all. Here each window goes out and spends the ceiling.
    register(
        "tasks.mail",
        timedelta(minutes=10),
        name="mail",
        timezone="Europe/Rome",
        ceiling=Ceiling(3, per="day"),
        overlap="overlap",
    )
    scheduler = make(tmp_path, database_url, clock)
    try:
        for _ in range(12):  # two hours in 10-minute steps
            scheduler.tick()
            clock.advance(minutes=10)
        assert len(published(tmp_path / "broker")) == 3
        record = scheduler.store.routines.by_name("mail")
        assert record.suspended_until == datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
        assert record.suspended_reason == (
            "ceiling 3 fires/day reached (3 used); resumes 2026-12-01 00:00 CET (Europe/Rome)"
        )
        [ceiling_skip] = [r for r in runs(scheduler, "mail") if r.reason == "ceiling"]
        assert ceiling_skip.skipped_last == datetime(2026, 11, 30, 22, 50, tzinfo=UTC)
        assert record.next_run_at == datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
        clock.now = datetime(2026, 11, 30, 23, 0, 1, tzinfo=UTC)
        scheduler.tick()
        assert len(published(tmp_path / "broker")) == 4
        resumed = scheduler.store.routines.by_name("mail")
        assert resumed.suspended_until is None and resumed.suspended_reason is None
    finally:
        scheduler.close()


def test_a_daily_ceiling_across_the_october_change_lasts_the_25_hour_day(
    tmp_path: Path, database_url: str
) -> None:
    # 2026-10-25 in Rome: 00:00 CEST (22:00 UTC the day before) to 00:00 CET (23:00 UTC).
    clock = FakeClock(datetime(2026, 10, 24, 22, 10, tzinfo=UTC))
    register(
        "tasks.mail",
        "0 * * * *",
        name="hourly",
        timezone="Europe/Rome",
        ceiling=Ceiling(2, per="day"),
    )
    scheduler = make(tmp_path, database_url, clock)
    try:
        for _ in range(6):
            scheduler.tick()
            clock.advance(hours=1)
        assert len(published(tmp_path / "broker")) == 2
        record = scheduler.store.routines.by_name("hourly")
        assert record.suspended_until == datetime(2026, 10, 25, 23, 0, tzinfo=UTC)
        assert "resumes 2026-10-26 00:00 CET (Europe/Rome)" in record.suspended_reason
    finally:
        scheduler.close()


def test_the_before_send_check_counts_runs_still_in_flight(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    """No worker reports back here: the runs are only `sent`, yet each costs a fire."""
    register(
        "tasks.mail",
        timedelta(minutes=1),
        name="mail",
        overlap="overlap",
        ceiling=Ceiling(2, per="hour"),
    )
    scheduler = make(tmp_path, database_url, clock)
    try:
        for _ in range(10):
            scheduler.tick()
            clock.advance(minutes=1)
        assert len(published(tmp_path / "broker")) == 2
        with scheduler.store.engine.connect() as conn:
            states = conn.execute(text("SELECT DISTINCT state FROM routine_runs")).scalars()
            assert set(states) == {"sent", "skipped"}
    finally:
        scheduler.close()


@pytest.mark.parametrize(
    ("policy", "sent", "skipped"),
    [("catch_up", 25, 263), ("latest", 1, 287), ("skip_to_next", 0, 288)],
)
def test_a_five_minute_routine_down_for_a_day_recovers_by_its_policy(
    tmp_path: Path, database_url: str, clock: FakeClock, policy: str, sent: int, skipped: int
) -> None:
    # overlap="overlap": what the catch-up policy replays, all of it sent at once
    # (under skip, queue and replace a recovery sends one: tests/tick/test_decide.py).
    register("tasks.poll", "*/5 * * * *", name="poll", catch_up=policy, overlap="overlap")
    scheduler = make(tmp_path, database_url, clock)
    try:
        scheduler.tick()  # first window 12:05
        clock.advance(hours=24, minutes=4)  # 288 windows due: 12:05 .. 12:00 next day
        scheduler.tick()
        windows = sorted(
            m["routine_window"] for m in published(tmp_path / "broker") if m["routine"] == "poll"
        )
        assert len(windows) == sent
        if sent:
            assert windows[-1] == "poll@2026-12-01T12:00:00+00:00"  # the newest ones
        [summary] = [r for r in runs(scheduler, "poll") if r.state == "skipped"]
        assert summary.skipped_count == skipped
        assert summary.skipped_first == datetime(2026, 11, 30, 12, 5, tzinfo=UTC)
        assert scheduler.store.routines.by_name("poll").next_run_at == datetime(
            2026, 12, 1, 12, 5, tzinfo=UTC
        )
    finally:
        scheduler.close()


def test_a_minutely_routine_down_for_a_year_recovers_without_listing_the_year(
    tmp_path: Path, database_url: str, clock: FakeClock, schedule_work: ScheduleWork
) -> None:
    register("tasks.poll", "* * * * *", name="poll", overlap="overlap")
    scheduler = make(tmp_path, database_url, clock)
    try:
        scheduler.tick()
        clock.advance(days=365)
        schedule_work.reset()
        scheduler.tick()
        assert len([m for m in published(tmp_path / "broker") if m["routine"] == "poll"]) == 25
        [summary] = [r for r in runs(scheduler, "poll") if r.state == "skipped"]
        assert summary.skipped_count == 365 * 24 * 60 - 25
        # The ends and the DST days of the plan, its catch-up tail and the next
        # window (56 today); listing the year would be 366.
        assert schedule_work.days_listed <= 80
    finally:
        scheduler.close()


def test_a_backlog_larger_than_the_batch_drains_oldest_first_over_ticks(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    for i in range(25):
        register("tasks.poll", "0 * * * *", name=f"hourly-{i:02d}")
    scheduler = make(tmp_path, database_url, clock, routines_batch_size=10)
    try:
        scheduler.tick()
        with scheduler.store.engine.begin() as conn:  # stagger: hourly-00 is the oldest
            for i in range(25):
                conn.execute(
                    text("UPDATE routines SET next_run_at = :t WHERE name = :n"),
                    {"t": datetime(2026, 11, 30, 12, 0, i), "n": f"hourly-{i:02d}"},
                )
        clock.now = datetime(2026, 11, 30, 12, 1, tzinfo=UTC)
        sleeps, claimed = [], []
        for _ in range(3):
            sleeps.append(scheduler.tick())
            claimed.append(scheduler.last_report.claimed)
            routines_sent = {m["routine"] for m in published(tmp_path / "broker")}
            if len(routines_sent) < 25:
                oldest_unsent = min(set(f"hourly-{i:02d}" for i in range(25)) - routines_sent)
                assert all(name < oldest_unsent for name in routines_sent)
        assert claimed == [10, 10, 5]
        assert sleeps[:2] == [0.0, 0.0]  # more was due: tick again at once
        assert len(published(tmp_path / "broker")) == 25
    finally:
        scheduler.close()
