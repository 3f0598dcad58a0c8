"""The admin API against SQLite and PostgreSQL, with an injected clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import inspect

from celery_routines import InvalidRoutine, UnknownRoutine
from celery_routines.config import Settings
from celery_routines.operator.admin import (
    OperationRefused,
    Routines,
    UnknownRun,
    parse_instant,
    preview,
)
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.marks import dst_note
from celery_routines.sending.publish import Publisher
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.harness import published
from tests.operators import add_routine, add_run, make_app, set_columns

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def broker_folder(tmp_path: Path) -> Path:
    return tmp_path / "broker"


@pytest.fixture
def admin(
    store: Store, database_url: str, broker_folder: Path, clock: FakeClock
) -> Iterator[Routines]:
    routines = Routines(make_app(broker_folder, database_url), clock=clock)
    yield routines
    routines.close()


def keys(broker_folder: Path) -> list[str]:
    return sorted(m["routine_window"] for m in published(broker_folder))


# -- reading -------------------------------------------------------------------


def test_list_shows_schedule_zone_next_run_in_utc_and_local_state_and_last_outcome(
    admin: Routines, store: Store
) -> None:
    nightly = add_routine(
        store,
        "nightly",
        cron="30 2 * * *",
        timezone="Europe/Rome",
        next_run_at=datetime(2026, 12, 1, 1, 30, tzinfo=UTC),
    )
    add_routine(store, "poll", cron=None, interval_seconds=300.0, paused=True)
    add_routine(store, "broken", cron="nope", last_error="routine 'broken': bad cron")
    add_routine(store, "capped", suspended_until=NOW + timedelta(hours=3))
    add_routine(store, "off", enabled=False)
    add_run(store, nightly, "nightly@x", "skipped", NOW, NOW, reason="overlap")

    by_name = {s.name: s for s in admin.list()}

    assert [s.name for s in admin.list()] == sorted(by_name)
    n = by_name["nightly"]
    assert (n.schedule, n.timezone, n.state) == ("30 2 * * *", "Europe/Rome", "enabled")
    assert n.next_run_utc == datetime(2026, 12, 1, 1, 30, tzinfo=UTC)
    assert n.next_run_local is not None
    assert n.next_run_local.isoformat() == "2026-12-01T02:30:00+01:00"
    assert n.last_outcome == "skipped (overlap)"
    assert by_name["poll"].schedule == "every 300s"
    assert by_name["poll"].timezone == "UTC"  # the configured default
    assert by_name["poll"].last_outcome is None
    assert {k: v.state for k, v in by_name.items() if k != "nightly"} == {
        "poll": "paused",
        "broken": "invalid",
        "capped": "suspended",
        "off": "disabled",
    }


def test_show_lists_the_next_five_windows_with_dst_notes(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    clock.now = datetime(2026, 3, 26, 12, 0, tzinfo=UTC)
    add_routine(
        store,
        "nightly",
        cron="30 2 * * *",
        timezone="Europe/Rome",
        next_run_at=datetime(2026, 3, 27, 1, 30, tzinfo=UTC),
    )
    detail = admin.show("nightly")
    assert [(w.local.isoformat(), w.note) for w in detail.next_windows] == [
        ("2026-03-27T02:30:00+01:00", None),
        ("2026-03-28T02:30:00+01:00", None),
        ("2026-03-29T03:30:00+02:00", "shifted: 02:30 does not exist"),
        ("2026-03-30T02:30:00+02:00", None),
        ("2026-03-31T02:30:00+02:00", None),
    ]
    assert detail.next_windows[2].idempotency_key == "nightly@2026-03-29T03:30:00+02:00"
    assert detail.definition["catch_up"] == "catch_up"
    assert detail.ceilings == []


def test_show_reports_spend_this_period_of_each_ceiling(admin: Routines, store: Store) -> None:
    ceiling = json.dumps(
        [{"limit": 3, "per": "day", "unit": "fires"}, {"limit": 10, "per": "month", "unit": "eur"}]
    )
    record = add_routine(store, "report", ceiling=ceiling, timezone="Europe/Rome")
    add_run(
        store,
        record,
        "report@a",
        "succeeded",
        NOW,
        NOW - timedelta(hours=1),
        spend=json.dumps({"fires": 1, "eur": 2.5}),
    )
    add_run(store, record, "report@b", "running", NOW, NOW - timedelta(minutes=5))
    add_run(store, record, "report@c", "skipped", NOW, NOW - timedelta(minutes=4))
    add_run(
        store,
        record,
        "report@old",
        "succeeded",
        NOW,
        NOW - timedelta(days=1),
        spend=json.dumps({"fires": 1, "eur": 4}),
    )

    usage = {u.unit: u for u in admin.show("report").ceilings}

    assert usage["fires"].spent == 2  # skips cost nothing; yesterday is another day
    assert usage["fires"].period_start == datetime(2026, 11, 29, 23, 0, tzinfo=UTC)
    assert usage["eur"].spent == 6.5  # the month includes yesterday


def test_an_unknown_name_raises_unknown_routine_naming_it(admin: Routines) -> None:
    for call in (admin.show, admin.pause, admin.resume, admin.trigger, admin.runs):
        with pytest.raises(UnknownRoutine, match="'ghost'"):
            call("ghost")


def test_runs_filters_by_routine_state_and_since_newest_first(
    admin: Routines, store: Store
) -> None:
    a = add_routine(store, "a")
    b = add_routine(store, "b")
    old = add_run(store, a, "a@1", "succeeded", NOW, NOW - timedelta(days=2))
    new = add_run(store, a, "a@2", "failed", NOW, NOW - timedelta(hours=1))
    other = add_run(store, b, "b@1", "failed", NOW, NOW - timedelta(minutes=1))

    assert [r.id for r in admin.runs()] == [other, new, old]
    assert [r.id for r in admin.runs("a")] == [new, old]
    assert [r.id for r in admin.runs(state="failed")] == [other, new]
    assert [r.id for r in admin.runs(since="1d")] == [other, new]
    assert [r.id for r in admin.runs(since="2026-11-30T11:30")] == [other]
    assert [r.id for r in admin.runs(limit=1)] == [other]
    assert admin.runs("b")[0].routine == "b"
    with pytest.raises(ValueError, match="'exploded'"):
        admin.runs(state="exploded")
    with pytest.raises(ValueError, match="'yesterday-ish'"):
        admin.runs(since="yesterday-ish")
    with pytest.raises(ValueError, match="limit"):
        admin.runs(limit=0)


def test_skips_lists_every_skipped_row_with_reason_and_count(admin: Routines, store: Store) -> None:
    a = add_routine(store, "a")
    add_run(
        store,
        a,
        "a@1..2",
        "skipped",
        NOW,
        NOW - timedelta(days=3),
        reason="catch_up_cap",
        skipped_count=7,
    )
    add_run(store, a, "a@3", "skipped", NOW, NOW - timedelta(hours=1), reason="overlap")
    add_run(store, a, "a@4", "succeeded", NOW, NOW)

    found = admin.skips()
    assert [(s.reason, s.skipped_count) for s in found] == [("overlap", 1), ("catch_up_cap", 7)]
    assert [s.reason for s in admin.skips(since="1d")] == ["overlap"]


# -- pause and resume ----------------------------------------------------------


def test_pause_is_idempotent_and_resume_skips_the_paused_windows_instead_of_a_burst(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    add_routine(store, "poll", cron="*/5 * * * *", next_run_at=NOW + timedelta(minutes=5))
    assert admin.pause("poll").changed is True
    assert admin.pause("poll").changed is False
    assert store.routines.by_name("poll").paused is True

    clock.advance(hours=2)  # 12:05 .. 14:00 fell due while paused: 24 windows
    result = admin.resume("poll")

    assert (result.changed, result.skipped_windows) == (True, 24)
    assert result.next_run_at == datetime(2026, 11, 30, 14, 5, tzinfo=UTC)
    record = store.routines.by_name("poll")
    assert record.paused is False and record.next_run_at == result.next_run_at
    [skip] = admin.skips()
    assert (skip.reason, skip.skipped_count) == ("paused", 24)
    assert skip.skipped_first == datetime(2026, 11, 30, 12, 5, tzinfo=UTC)
    assert skip.skipped_last == datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
    assert admin.resume("poll").changed is False


def test_resume_with_catch_up_leaves_the_missed_windows_to_the_catch_up_policy(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    add_routine(store, "poll", next_run_at=NOW + timedelta(minutes=5), paused=True)
    clock.advance(hours=2)
    result = admin.resume("poll", catch_up=True)
    assert result.skipped_windows == 0
    assert store.routines.by_name("poll").next_run_at == NOW + timedelta(minutes=5)
    assert admin.skips() == []


def test_resume_before_the_next_window_changes_nothing_but_the_flag(
    admin: Routines, store: Store
) -> None:
    add_routine(
        store,
        "poll",
        cron=None,
        interval_seconds=3600.0,
        next_run_at=NOW + timedelta(minutes=7),
        paused=True,
    )
    result = admin.resume("poll")
    assert result.next_run_at == NOW + timedelta(minutes=7)
    assert store.routines.by_name("poll").next_run_at == NOW + timedelta(minutes=7)


# -- sending -------------------------------------------------------------------


def test_trigger_writes_the_row_first_and_sends_under_a_manual_key(
    admin: Routines, store: Store, broker_folder: Path
) -> None:
    add_routine(store, "report", args=json.dumps([1, "x"]), kwargs=json.dumps({"k": 2}))
    result = admin.trigger("report")

    assert result.outcome == "sent"
    assert result.idempotency_key.startswith("report@manual:")
    [message] = published(broker_folder)
    assert message["id"] == result.run_id
    assert message["routine"] == "report"
    assert message["routine_window"] == result.idempotency_key
    assert message["task"] == "tasks.noop"
    run = store.runs.get(result.run_id)
    assert run.state == "sent" and run.scheduled_for == NOW
    # A second trigger is a new manual key, never a collision.
    assert admin.trigger("report", force=True).idempotency_key != result.idempotency_key


def test_trigger_respects_overlap_skip_and_the_ceiling_unless_forced(
    admin: Routines, store: Store, broker_folder: Path
) -> None:
    record = add_routine(
        store, "report", ceiling=json.dumps([{"limit": 2, "per": "day", "unit": "fires"}])
    )
    open_run = add_run(store, record, "report@a", "running", NOW, NOW - timedelta(minutes=1))
    with pytest.raises(OperationRefused, match=f"'report' has 1 open run.*{open_run}"):
        admin.trigger("report")
    assert published(broker_folder) == []

    admin.trigger("report", force=True)  # now 2 fires spent of 2
    set_columns(store, "report", overlap="overlap")
    with pytest.raises(
        OperationRefused, match="would pass its ceiling \\(2 of 2 fires used this day"
    ):
        admin.trigger("report")
    assert len(published(broker_folder)) == 1


def test_trigger_refuses_a_row_whose_args_are_not_json_before_writing_anything(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "bad", args="[1,")
    with pytest.raises(InvalidRoutine, match="'bad': args is not valid JSON"):
        admin.trigger("bad")
    assert admin.runs("bad") == []


def test_trigger_with_settings_only_says_it_needs_the_app(
    store: Store, database_url: str, clock: FakeClock
) -> None:
    add_routine(store, "report")
    with Routines(Settings(database_url=database_url), clock=clock) as routines:
        assert [s.name for s in routines.list()] == ["report"]
        with pytest.raises(Exception, match="needs the Celery app"):
            routines.trigger("report")


def test_a_broker_failure_is_recorded_like_beats_own_and_reported(
    store: Store, database_url: str, clock: FakeClock
) -> None:
    class Down(Publisher):
        def publish(self, run: object) -> None:
            raise ConnectionError("broker down")

        def publish_many(self, runs: list[object]) -> list[Exception | None]:
            return [ConnectionError("broker down") for _ in runs]

        def close(self) -> None:
            pass

    add_routine(store, "report")
    add_routine(store, "once", max_retries=0)
    with Routines(Settings(database_url=database_url), clock=clock, publisher=Down()) as r:
        result = r.trigger("report")
        final = r.trigger("once")
    assert result.outcome == "send_failed" and "broker down" in result.error
    # Recorded exactly as beat records its own failed sends: retried later
    # under the routine's retry policy, or failed when it allows no retry.
    run = store.runs.get(result.run_id)
    assert (run.state, run.reason) == ("retrying", "send_failed")
    assert run.retry_at == NOW + timedelta(minutes=1)
    assert store.runs.get(final.run_id).state == "failed"


def test_backfill_sends_past_windows_oldest_first_and_a_second_backfill_sends_nothing(
    admin: Routines, store: Store, broker_folder: Path
) -> None:
    record = add_routine(store, "nightly", cron="30 2 * * *", timezone="Europe/Rome")
    # Beat already sent the 27th: backfill must not send it again.
    add_run(
        store,
        record,
        "nightly@2026-11-27T02:30:00+01:00",
        "succeeded",
        datetime(2026, 11, 27, 1, 30, tzinfo=UTC),
        NOW,
    )

    first = admin.backfill("nightly", "2026-11-25", "2026-11-28T02:30", overlap="overlap")

    assert (first.sent, first.existing, first.failed) == (3, 1, 0)
    # Sent in this order (the broker folder orders files only to the millisecond).
    assert [w.idempotency_key for w in first.windows if w.outcome == "sent"] == keys(broker_folder)
    assert keys(broker_folder) == [
        "nightly@2026-11-25T02:30:00+01:00",
        "nightly@2026-11-26T02:30:00+01:00",
        "nightly@2026-11-28T02:30:00+01:00",
    ]
    second = admin.backfill("nightly", "2026-11-25", "2026-11-28T02:30", overlap="overlap")
    assert (second.sent, second.existing) == (0, 4)
    assert len(published(broker_folder)) == 3


def test_backfill_of_an_interval_stays_on_the_routines_own_chain_of_windows(
    admin: Routines, store: Store, broker_folder: Path
) -> None:
    add_routine(
        store,
        "poll",
        cron=None,
        interval_seconds=600.0,
        next_run_at=datetime(2026, 11, 30, 12, 7, 30, tzinfo=UTC),
    )
    result = admin.backfill("poll", "2026-11-30T11:20", "2026-11-30T11:50", overlap="overlap")
    assert [w.scheduled_for.strftime("%H:%M:%S") for w in result.windows] == [
        "11:27:30",
        "11:37:30",
        "11:47:30",
    ]


@pytest.mark.parametrize(
    ("overlap", "first_call", "second_call"),
    [
        # skip and queue: the oldest new window; the next once it has ended.
        ("skip", ["06:00"], ["07:00"]),
        ("queue", ["06:00"], ["07:00"]),
        # replace: only the newest; then the newest left.
        ("replace", ["09:00"], ["08:00"]),
        ("overlap", ["06:00", "07:00", "08:00", "09:00"], []),
    ],
)
def test_a_backfill_follows_the_routines_overlap_policy(
    overlap: str,
    first_call: list[str],
    second_call: list[str],
    admin: Routines,
    store: Store,
    broker_folder: Path,
) -> None:
    add_routine(store, "hourly", cron="0 * * * *", timezone="UTC", overlap=overlap)
    span = ("hourly", "2026-11-30T06:00", "2026-11-30T09:00")

    def sent(result) -> list[str]:
        return [w.scheduled_for.strftime("%H:%M") for w in result.windows if w.outcome == "sent"]

    first = admin.backfill(*span)
    assert sent(first) == first_call
    assert (first.overlap, first.left) == (overlap, 4 - len(first_call))
    if overlap in ("skip", "queue"):
        # Its run is open: the next backfill waits for it (or is forced).
        with pytest.raises(OperationRefused, match="wait for it to finish"):
            admin.backfill(*span)
    for window in first.windows:  # a worker ran them
        assert store.outcomes.claim_start(window.run_id, "worker-1", NOW)
        store.outcomes.succeed(window.run_id, NOW, spend=None)
    second = admin.backfill(*span)
    assert sent(second) == second_call
    # The backfill's own --overlap: every window left at once.
    rest = admin.backfill(*span, overlap="overlap")
    assert rest.left == 0 and rest.sent == 4 - len(first_call) - len(second_call)
    with pytest.raises(InvalidRoutine, match=r"routine 'hourly': --overlap must be .* got 'all'"):
        admin.backfill(*span, overlap="all")


def test_backfill_refuses_the_future_a_reversed_range_and_a_huge_range(
    admin: Routines, store: Store, broker_folder: Path
) -> None:
    add_routine(store, "minutely", cron="* * * * *")
    with pytest.raises(ValueError, match="is in the future"):
        admin.backfill("minutely", "2026-11-30T11:00", "2026-11-30T13:00")
    with pytest.raises(ValueError, match="is before --from"):
        admin.backfill("minutely", "2026-11-30T11:00", "2026-11-30T10:00")
    with pytest.raises(ValueError, match="covers 1441 windows; at most 1000"):
        admin.backfill("minutely", "2026-11-28T00:00", "2026-11-29T00:00")
    with pytest.raises(ValueError, match="'soon'"):
        admin.backfill("minutely", "soon", "now")
    assert published(broker_folder) == []


def test_replay_sends_a_failed_window_as_its_next_attempt_once(
    admin: Routines, store: Store, broker_folder: Path
) -> None:
    record = add_routine(store, "report")
    window = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)
    failed = add_run(store, record, "report@w", "failed", window, NOW, error="boom")
    done = add_run(store, record, "report@v", "succeeded", window, NOW)

    result = admin.replay(failed)

    assert (result.idempotency_key, result.attempt, result.outcome) == ("report@w", 2, "sent")
    [message] = published(broker_folder)
    assert (message["routine_window"], message["routine_attempt"]) == ("report@w", 2)
    assert store.runs.get(result.run_id).scheduled_for == window
    with pytest.raises(InvalidRoutine, match="already has attempt 2"):
        admin.replay(failed)
    with pytest.raises(InvalidRoutine, match="is succeeded; only failed, skipped, lost"):
        admin.replay(done)
    with pytest.raises(UnknownRun, match="'no-such-run'"):
        admin.replay("no-such-run")


def test_replay_of_a_summary_of_many_skips_points_to_backfill(
    admin: Routines, store: Store
) -> None:
    record = add_routine(store, "report")
    summary = add_run(
        store, record, "report@a..b", "skipped", NOW, NOW, reason="catch_up_cap", skipped_count=9
    )
    with pytest.raises(InvalidRoutine, match=r"9 skipped windows.*backfill --from"):
        admin.replay(summary)


def test_a_name_that_looks_like_sql_is_only_a_name(admin: Routines, store: Store) -> None:
    name = "x'; DROP TABLE routines; --"
    add_routine(store, name)
    assert [s.name for s in admin.list()] == [name]
    assert admin.pause(name).changed
    assert admin.trigger(name, force=True).outcome == "sent"
    assert admin.runs(name)[0].routine == name
    with pytest.raises(UnknownRoutine):
        admin.show("' OR '1'='1")
    assert {"routines", "routine_runs"} <= set(inspect(store.engine).get_table_names())


def test_migrate_reports_before_and_after(database_url: str, clock: FakeClock) -> None:
    with Routines(Settings(database_url=database_url), clock=clock) as routines:
        first = routines.migrate()
        second = routines.migrate()
    assert first.before is None and first.after
    assert second.before == second.after == first.after


# -- pure parts ----------------------------------------------------------------


def test_parse_instant_reads_dates_wall_times_offsets_and_ages() -> None:
    rome = "Europe/Rome"
    assert parse_instant("2026-11-30", rome, NOW) == datetime(2026, 11, 29, 23, tzinfo=UTC)
    assert parse_instant("2026-11-30 08:00", rome, NOW) == datetime(2026, 11, 30, 7, tzinfo=UTC)
    assert parse_instant("2026-11-30T08:00Z", rome, NOW) == datetime(2026, 11, 30, 8, tzinfo=UTC)
    assert parse_instant("2h", rome, NOW) == NOW - timedelta(hours=2)
    assert parse_instant("now", rome, NOW) == NOW
    # A wall time in the spring gap is shifted like a window (guarantee 4).
    assert parse_instant("2026-03-29T02:30", rome, NOW) == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    with pytest.raises(ValueError, match="'30/11/2026' is not a date"):
        parse_instant("30/11/2026", rome, NOW)


def test_preview_needs_no_database_and_marks_both_passes_of_a_repeated_hour() -> None:
    windows = preview("*/30 * * * *", "Europe/Rome", "2026-10-25T02:00", 4)
    assert [(w.local.strftime("%H:%M%z"), w.note) for w in windows] == [
        ("02:00+0200", "first of two 02:00s"),
        ("02:30+0200", "first of two 02:30s"),
        ("02:00+0100", "second of two 02:00s"),
        ("02:30+0100", "second of two 02:30s"),
    ]
    fixed = preview("30 2 * * *", "Europe/Rome", "2026-10-25", 1)
    assert fixed[0].note == "first of two 02:30s"
    with pytest.raises(ValueError, match="'61 \\* \\* \\* \\*'"):
        preview("61 * * * *")
    with pytest.raises(ValueError, match="'Mars/Olympus'"):
        preview("* * * * *", "Mars/Olympus")


def test_intervals_never_get_a_dst_note() -> None:
    window = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    assert dst_note(IntervalSchedule(60), window) is None
    assert dst_note(CronSchedule("30 1 * * *", "UTC"), window) is None


def test_show_still_answers_for_a_row_with_a_bad_cron_or_a_bad_ceiling(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "broken", cron="61 * * * *", ceiling="[{]")
    detail = admin.show("broken")
    assert detail.next_windows == []
    assert "'61 * * * *' is invalid" in detail.schedule_error
    assert "ceiling is not valid JSON" in detail.ceiling_error
    with pytest.raises(InvalidRoutine, match="'broken': ceiling is not valid JSON"):
        admin.trigger("broken")


def test_list_reads_the_newest_run_of_each_routine(admin: Routines, store: Store) -> None:
    a = add_routine(store, "a")
    b = add_routine(store, "b")
    add_run(store, a, "a@1", "failed", NOW, NOW - timedelta(hours=2))
    add_run(store, a, "a@2", "succeeded", NOW, NOW - timedelta(hours=1))
    add_run(store, a, "a@2", "running", NOW, NOW - timedelta(hours=1), attempt=2)
    add_run(store, b, "b@1", "lost", NOW, NOW - timedelta(days=9))
    outcomes = {s.name: s.last_outcome for s in admin.list()}
    assert outcomes == {"a": "running", "b": "lost"}


def test_a_run_past_its_deadline_or_still_pending_does_not_block_a_trigger(
    admin: Routines, store: Store, broker_folder: Path
) -> None:
    record = add_routine(store, "report")
    add_run(store, record, "report@a", "sent", NOW, NOW, deadline_at=NOW - timedelta(minutes=1))
    add_run(store, record, "report@b", "pending", NOW, NOW)
    assert admin.trigger("report").outcome == "sent"
    assert admin.show("report").open_runs == 1  # the one just sent


def test_backfill_keys_each_pass_of_a_repeated_hour_and_the_shifted_spring_window(
    admin: Routines, store: Store, broker_folder: Path
) -> None:
    add_routine(
        store, "half-hourly", cron="*/30 * * * *", timezone="Europe/Rome", overlap="overlap"
    )
    add_routine(store, "nightly", cron="30 2 * * *", timezone="Europe/Rome")

    autumn = admin.backfill("half-hourly", "2026-10-25T02:00+02:00", "2026-10-25T02:30+01:00")
    spring = admin.backfill("nightly", "2026-03-29", "2026-03-29T23:00")

    # Both passes of 02:00 and 02:30 are distinct windows with distinct keys.
    assert [w.idempotency_key.split("@")[1] for w in autumn.windows] == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
    ]
    # 02:30 does not exist that night: the window fired at 03:30 CEST.
    assert [w.idempotency_key for w in spring.windows] == ["nightly@2026-03-29T03:30:00+02:00"]
    assert len(published(broker_folder)) == 5


def test_a_lost_run_can_be_replayed(admin: Routines, store: Store, broker_folder: Path) -> None:
    record = add_routine(store, "report")
    lost = add_run(store, record, "report@w", "lost", NOW, NOW, reason="lost")
    assert admin.replay(lost).attempt == 2
    assert [m["routine_attempt"] for m in published(broker_folder)] == [2]


def test_show_and_list_say_done_for_a_fired_one_off_and_preview_lists_a_solar_schedule(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    from celery_routines import Scheduler, register
    from celery_routines.schedules.solar import SolarSchedule
    from tests.harness import filesystem_app

    register("tasks.remind", name="once", at=clock.now + timedelta(minutes=1))
    app = filesystem_app(tmp_path / "broker", database_url)
    beat = Scheduler(app, clock=clock)
    try:
        beat.tick()
        admin = Routines(app, clock=clock)
        closing = admin
        before = admin.show("once")
        assert [w.utc for w in before.next_windows] == [clock.now + timedelta(minutes=1)]
        clock.advance(minutes=1)
        beat.tick()
        [summary] = [r for r in admin.list() if r.name == "once"]
        assert (summary.state, summary.next_run_utc) == ("done", None)
        assert summary.schedule == "once at 2026-11-30T12:01:00+00:00"
        assert admin.show("once").next_windows == []
        closing.close()
    finally:
        beat.close()
    windows = preview("sunrise 45.46 9.19", "Europe/Rome", "2026-06-01", 2, clock=clock)
    expected = SolarSchedule("sunrise", 45.46, 9.19).next_after(
        datetime(2026, 5, 31, 22, 0, tzinfo=UTC)
    )
    assert windows[0].utc == expected and windows[0].local.tzname() == "CEST"
