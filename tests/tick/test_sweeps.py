"""The run lifecycle at the beat tick, on SQLite and PostgreSQL, with an
injected clock: retries from ``retry_at``, lost runs, overlap policies.

The worker's part is played through the same store calls the worker makes
(``claim_start``, ``outcomes.record_failure``); tests/e2e/test_lifecycle.py runs
the same paths with real workers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from celery_routines import Scheduler, register
from celery_routines.store import RunRecord, Store
from celery_routines.worker import outcomes
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published, runs_for

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class RecordingRevoker:
    def __init__(self) -> None:
        self.revoked: list[str] = []

    def revoke(self, run_ids: Sequence[str]) -> None:
        self.revoked.extend(run_ids)


def make_scheduler(folder: Path, database_url: str, clock: FakeClock, **conf) -> Scheduler:
    return Scheduler(filesystem_app(folder, database_url, **conf), clock=clock)


def runs(store: Store, name: str) -> list[RunRecord]:
    record = store.routines.by_name(name)
    return sorted(
        runs_for(store, record.id), key=lambda r: (r.scheduled_for, r.attempt, r.created_at)
    )


def set_paused(store: Store, name: str, paused: bool) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE routines SET paused = :p WHERE name = :n"), {"p": paused, "n": name}
        )


def fail(store: Store, run_id: str, now: datetime, error: str = "RuntimeError: boom") -> None:
    """What the worker does for a body that raised."""
    assert store.outcomes.claim_start(run_id, "worker-1", now)
    outcomes.record_failure(store, run_id, error, now, lost=False)


def test_failed_attempts_are_retried_after_1_2_4_minutes_across_a_beat_restart(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register("tasks.flaky", timedelta(hours=1), name="flaky", max_retries=3)
    folder = tmp_path / "broker"
    beat = make_scheduler(folder, database_url, clock)
    beat.tick()
    clock.advance(hours=1)
    beat.tick()  # attempt 1 of the 13:00 window
    store = beat.store
    sent_at = [clock.now]
    for attempt, wait in ((1, 1), (2, 2), (3, 4)):
        [run] = [r for r in runs(store, "flaky") if r.attempt == attempt]
        fail(store, run.id, clock.now)
        assert store.runs.get(run.id).retry_at == clock.now + timedelta(minutes=wait)
        if attempt == 2:
            beat.close()  # a restart: the retry lives in the database only
            beat = make_scheduler(folder, database_url, clock)
        clock.advance(minutes=wait, seconds=-1)
        beat.tick()
        assert len(published(folder)) == attempt, "retried before retry_at"
        clock.advance(seconds=1)
        beat.tick()
        beat.tick()
        assert len(published(folder)) == attempt + 1
        sent_at.append(clock.now)
    beat.close()
    messages = published(folder)
    assert [m["routine_attempt"] for m in messages] == [1, 2, 3, 4]
    assert {m["routine_window"] for m in messages} == {"flaky@2026-11-30T13:00:00+00:00"}
    gaps = [later - earlier for earlier, later in itertools.pairwise(sent_at)]
    assert gaps == [timedelta(minutes=1), timedelta(minutes=2), timedelta(minutes=4)]
    assert [(r.attempt, r.state) for r in runs(store, "flaky")] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
        (4, "sent"),
    ]
    last = runs(store, "flaky")[-1]
    fail(store, last.id, clock.now)
    assert store.runs.get(last.id).state == "failed"  # max_retries=3: four attempts in all


def test_two_beats_never_both_send_the_same_retry(
    database_url: str, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    register("tasks.flaky", timedelta(hours=1), name="flaky")
    folder = tmp_path / "broker"
    first = make_scheduler(folder, database_url, clock)
    second = make_scheduler(folder, database_url, clock)
    try:
        first.tick()
        clock.advance(hours=1)
        first.tick()
        [run] = runs(first.store, "flaky")
        fail(first.store, run.id, clock.now)
        clock.advance(minutes=1)
        # Both beats read the due retry before either takes it.
        stale = second.store.retries.retries_due(clock.now, 10)
        monkeypatch.setattr(second.store.retries, "retries_due", lambda now, limit: stale)
        stale_probe = iter([second.store.probe(clock.now, second.holder)])
        real_probe = second.store.probe
        monkeypatch.setattr(
            second.store,
            "probe",
            lambda now, holder, *arb, **clock: (
                next(stale_probe, None) or real_probe(now, holder, *arb, **clock)
            ),
        )
        first.tick()
        second.tick()
        assert [m["routine_attempt"] for m in published(folder)] == [1, 2]
        assert second.last_report.conflicts == 1
    finally:
        first.close()
        second.close()


def test_a_run_past_its_deadline_becomes_lost_visibly_and_is_retried(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register("tasks.slow", timedelta(hours=1), name="slow")
    folder = tmp_path / "broker"
    beat = make_scheduler(folder, database_url, clock, routines_run_timeout=300)
    try:
        beat.tick()
        clock.advance(hours=1)
        beat.tick()
        store = beat.store
        [run] = runs(store, "slow")
        assert store.outcomes.claim_start(
            run.id, "worker-1", clock.now, deadline_at=clock.now + timedelta(seconds=300)
        )
        # The worker is SIGKILLed: nothing more is heard from it.
        clock.advance(seconds=299)
        beat.tick()
        assert store.runs.get(run.id).state == "running"
        clock.advance(seconds=6)
        beat.tick()
        lost = store.runs.get(run.id)
        assert (lost.state, lost.reason) == ("retrying", "lost")
        assert "worker-1" in lost.error
        assert lost.retry_at == clock.now + timedelta(minutes=1)
        clock.advance(minutes=1)
        beat.tick()
        assert [(r.attempt, r.state) for r in runs(store, "slow")] == [(1, "lost"), (2, "sent")]
        assert [m["routine_attempt"] for m in published(folder)] == [1, 2]
    finally:
        beat.close()


def test_two_beats_declare_a_run_lost_once(
    database_url: str, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    register("tasks.slow", timedelta(hours=1), name="slow")
    folder = tmp_path / "broker"
    first = make_scheduler(folder, database_url, clock, routines_run_timeout=60)
    second = make_scheduler(folder, database_url, clock, routines_run_timeout=60)
    try:
        first.tick()
        clock.advance(hours=1)
        first.tick()
        [run] = runs(first.store, "slow")
        assert first.store.outcomes.claim_start(
            run.id, "worker-1", clock.now, deadline_at=clock.now + timedelta(seconds=60)
        )
        clock.advance(minutes=2)
        # Both beats read the overdue run before either moves it.
        stale = second.store.runs.overdue(clock.now, 10)
        monkeypatch.setattr(second.store.runs, "overdue", lambda now, limit: stale)
        first.tick()
        second.tick()
        assert (first.last_report.lost, second.last_report.lost) == (1, 0)
        assert first.store.runs.get(run.id).state == "retrying"
    finally:
        first.close()
        second.close()


def test_the_tick_wakes_for_a_retry_and_does_not_spin_on_an_overdue_run(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register("tasks.flaky", timedelta(hours=1), name="flaky")
    beat = make_scheduler(
        tmp_path / "b",
        database_url,
        clock,
        beat_max_loop_interval=300,
        routines_refresh_seconds=300,
    )
    try:
        beat.tick()
        clock.advance(hours=1)
        beat.tick()
        [run] = runs(beat.store, "flaky")
        fail(beat.store, run.id, clock.now)
        assert beat.tick() == pytest.approx(60, abs=0.1)  # wakes for the retry
        # An open run past its deadline while the lost sweep waits its turn:
        # the sleep is not zero.
        clock.advance(minutes=1)
        beat.tick()
        with beat.store.engine.begin() as conn:
            conn.execute(text("UPDATE routine_runs SET deadline_at = :t"), {"t": clock.now})
        clock.advance(seconds=1)
        assert beat.tick() > 1
    finally:
        beat.close()


def test_a_paused_routine_sends_no_retry_and_resuming_replays_none(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register("tasks.flaky", timedelta(hours=1), name="flaky")
    folder = tmp_path / "broker"
    beat = make_scheduler(folder, database_url, clock)
    try:
        beat.tick()
        clock.advance(hours=1)
        beat.tick()
        store = beat.store
        [run] = runs(store, "flaky")
        fail(store, run.id, clock.now)
        set_paused(store, "flaky", True)
        clock.advance(minutes=30)
        beat.tick()
        dropped = store.runs.get(run.id)
        assert (dropped.state, dropped.reason) == ("failed", "no_retry:paused")
        set_paused(store, "flaky", False)
        beat.tick()
        clock.advance(seconds=10)
        beat.tick()
        assert len(published(folder)) == 1  # no burst of retries on resume
    finally:
        beat.close()


def test_a_failed_send_is_retried_when_the_broker_is_back(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register("tasks.poll", timedelta(hours=1), name="poll")
    folder = tmp_path / "broker"
    app = filesystem_app(folder, database_url)
    app.conf.update(
        broker_url="redis://127.0.0.1:1/0",
        broker_connection_retry=False,
        broker_connection_max_retries=0,
    )
    down = Scheduler(app, clock=clock)
    down.tick()
    clock.advance(hours=1)
    down.tick()
    [run] = runs(down.store, "poll")
    assert (run.state, run.reason) == ("retrying", "send_failed")
    down.close()
    up = make_scheduler(folder, database_url, clock)
    try:
        clock.advance(minutes=1)
        up.tick()
        assert [m["routine_attempt"] for m in published(folder)] == [2]
        assert [(r.attempt, r.state) for r in runs(up.store, "poll")] == [
            (1, "failed"),
            (2, "sent"),
        ]
    finally:
        up.close()


# -- overlap ---------------------------------------------------------------------


def start_slow_run(policy: str, database_url: str, tmp_path: Path, clock: FakeClock):
    register("tasks.slow", timedelta(minutes=1), name="slow", overlap=policy)
    folder = tmp_path / "broker"
    beat = make_scheduler(folder, database_url, clock)
    revoker = RecordingRevoker()
    beat.engine.writer.revoker = revoker
    beat.tick()
    clock.advance(minutes=1)
    beat.tick()
    [first] = runs(beat.store, "slow")
    assert beat.store.outcomes.claim_start(first.id, "worker-1", clock.now)
    clock.advance(minutes=1)  # the next window is due; the first run is still running
    return beat, folder, first, revoker


def test_overlap_skip_records_a_skipped_row_and_advances(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    beat, folder, _first, _ = start_slow_run("skip", database_url, tmp_path, clock)
    try:
        beat.tick()
        assert len(published(folder)) == 1
        skipped = [r for r in runs(beat.store, "slow") if r.state == "skipped"]
        assert [(r.reason, r.skipped_count) for r in skipped] == [("overlap", 1)]
        assert beat.store.routines.by_name("slow").next_run_at == clock.now + timedelta(minutes=1)
    finally:
        beat.close()


def test_overlap_queue_holds_the_window_until_the_open_run_ends_without_spinning(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    beat, folder, first, _ = start_slow_run("queue", database_url, tmp_path, clock)
    try:
        due = beat.store.routines.by_name("slow").next_run_at
        sleeps = [beat.tick() for _ in range(3)]
        assert len(published(folder)) == 1
        assert beat.store.routines.by_name("slow").next_run_at == due  # not advanced
        assert min(sleeps) > 0.5, "a queued routine made the tick spin"
        assert max(sleeps) <= 1.1, "the queued window is not rechecked within a second"
        assert beat.last_report.queued == 1
        beat.store.outcomes.succeed(first.id, clock.now, spend=None)
        beat.tick()  # the first tick after the run ended, at the same instant
        assert len(published(folder)) == 2
        assert published(folder)[1]["routine_window"] == "slow@2026-11-30T12:02:00+00:00"
    finally:
        beat.close()


def test_overlap_queue_sends_missed_windows_one_at_a_time(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    beat, folder, first, _ = start_slow_run("queue", database_url, tmp_path, clock)
    try:
        clock.advance(minutes=2)  # three windows due behind the open run
        beat.tick()
        beat.store.outcomes.succeed(first.id, clock.now, spend=None)
        beat.tick()
        beat.tick()
        assert len(published(folder)) == 2  # one queued window, not a burst of three
    finally:
        beat.close()


def test_overlap_overlap_sends_anyway(database_url: str, tmp_path: Path, clock: FakeClock) -> None:
    beat, folder, first, _ = start_slow_run("overlap", database_url, tmp_path, clock)
    try:
        beat.tick()
        assert len(published(folder)) == 2
        assert beat.store.runs.get(first.id).state == "running"
    finally:
        beat.close()


def test_overlap_replace_revokes_the_open_run_and_sends_the_new_window(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    beat, folder, first, revoker = start_slow_run("replace", database_url, tmp_path, clock)
    try:
        beat.tick()
        assert len(published(folder)) == 2
        assert revoker.revoked == [first.id]
        replaced = beat.store.runs.get(first.id)
        assert (replaced.state, replaced.reason) == ("failed", "replaced")
        assert "slow@2026-11-30T12:02:00+00:00" in replaced.error
    finally:
        beat.close()


def test_a_lost_run_does_not_hold_back_the_next_window(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    beat, folder, first, _ = start_slow_run("skip", database_url, tmp_path, clock)
    try:
        with beat.store.engine.begin() as conn:
            conn.execute(
                text("UPDATE routine_runs SET deadline_at = :t WHERE id = :i"),
                {"t": clock.now - timedelta(seconds=1), "i": first.id},
            )
        beat.tick()
        assert [m["routine_window"] for m in published(folder)][-1] == (
            "slow@2026-11-30T12:02:00+00:00"
        )
    finally:
        beat.close()


def test_a_retry_is_checked_against_the_ceiling_before_it_is_sent(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    from celery_routines import Ceiling

    register("tasks.flaky", "0 * * * *", name="flaky", ceiling=Ceiling(2, per="day"))
    folder = tmp_path / "broker"
    beat = make_scheduler(folder, database_url, clock)
    try:
        beat.tick()
        clock.now = T0 + timedelta(hours=1)
        beat.tick()  # window 13:00: fire 1 of 2
        store = beat.store
        [first] = runs(store, "flaky")
        fail(store, first.id, clock.now)
        clock.advance(minutes=1)
        beat.tick()  # attempt 2: fire 2 of 2, the ceiling is reached
        assert store.routines.by_name("flaky").suspended_until is not None
        second = runs(store, "flaky")[-1]
        fail(store, second.id, clock.now)
        clock.advance(minutes=2)
        beat.tick()  # attempt 3 would be fire 3: not sent
        clock.now = T0 + timedelta(hours=2)
        beat.tick()
        assert [m["routine_attempt"] for m in published(folder)] == [1, 2]
    finally:
        beat.close()


def test_a_retry_past_max_lateness_is_skipped_as_late_like_a_first_attempt(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    # Retries after 1 minute, then 2: with max_lateness 90 s the first retry
    # (window + 61 s) goes out, the second (window + 3 min) is late.
    register("tasks.flaky", timedelta(hours=1), name="flaky", max_lateness=90)
    folder = tmp_path / "b"
    beat = make_scheduler(folder, database_url, clock)
    try:
        beat.tick()
        clock.advance(hours=1)
        beat.tick()
        [run] = runs(beat.store, "flaky")
        window = run.scheduled_for
        fail(beat.store, run.id, clock.now)
        clock.advance(minutes=1, seconds=1)
        beat.tick()
        assert len(published(folder)) == 2  # attempt 2 went out
        second = max(runs(beat.store, "flaky"), key=lambda r: r.attempt)
        fail(beat.store, second.id, clock.now)
        clock.advance(minutes=2, seconds=1)
        beat.tick()
        assert len(published(folder)) == 2  # attempt 3 did not
        third = max(runs(beat.store, "flaky"), key=lambda r: r.attempt)
        assert (third.attempt, third.state, third.reason) == (3, "skipped", "late")
        assert third.scheduled_for == window
        assert {r.attempt: r.state for r in runs(beat.store, "flaky")}[2] == "failed"
    finally:
        beat.close()


@pytest.mark.parametrize("policy", ["skip", "queue", "replace", "overlap"])
def test_a_retry_follows_the_overlap_policy_while_a_later_window_runs(
    policy: str, database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register(
        "tasks.flaky", timedelta(minutes=1), name="flaky", overlap=policy, retry_base_seconds=90
    )
    folder = tmp_path / "broker"
    beat = make_scheduler(folder, database_url, clock)
    try:
        beat.tick()
        clock.advance(minutes=1)
        beat.tick()  # 12:01 attempt 1
        [first] = runs(beat.store, "flaky")
        fail(beat.store, first.id, clock.now)  # retried at 12:02:30
        clock.advance(minutes=1)
        beat.tick()  # 12:02: nothing open (the failed attempt waits as retrying)
        later = next(r for r in runs(beat.store, "flaky") if r.scheduled_for == clock.now)
        assert beat.store.outcomes.claim_start(later.id, "worker-1", clock.now)  # 12:02 runs
        clock.advance(seconds=30)
        beat.tick()  # 12:02:30: the retry is due while 12:02 runs
        attempts = [m["routine_attempt"] for m in published(folder)]
        retry = beat.store.runs.get(first.id)
        if policy == "overlap":
            assert attempts == [1, 1, 2]  # beside the run in progress
            return
        assert attempts == [1, 1]  # never two bodies at once
        if policy == "replace":
            # The newer window replaced it: not retried, visibly.
            assert (retry.state, retry.reason) == ("failed", "no_retry:replaced")
            return
        # skip, queue: it waits for the run in progress, then goes.
        assert retry.state == "retrying" and retry.retry_at > clock.now
        beat.store.outcomes.succeed(later.id, clock.now, spend=None)
        clock.advance(seconds=1)
        beat.tick()
        assert [m["routine_attempt"] for m in published(folder)] == [1, 1, 2]
        assert published(folder)[-1]["routine_window"] == "flaky@2026-11-30T12:01:00+00:00"
    finally:
        beat.close()
