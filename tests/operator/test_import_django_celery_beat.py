"""``celery routines import django-celery-beat URL`` against django-celery-beat's
real tables (its own migrations, rows saved through its models) in SQLite and
PostgreSQL, into every store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.schedules import crontab
from click.testing import CliRunner

from celery_routines import Scheduler
from celery_routines.config import Settings
from celery_routines.operator import commands
from celery_routines.operator.admin import Routines
from celery_routines.operator.cli import routines
from tests.conftest import FakeClock
from tests.harness import published, recorded_changes
from tests.operator.dcb import DCB
from tests.operators import add_routine, cli_context, cli_invoker, make_app, ok, one_error

NOW = datetime(2026, 10, 24, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def routines_url(sqlite_url: str, migrated_schema: None) -> str:
    return sqlite_url


@pytest.fixture
def admin(routines_url: str, clock: FakeClock) -> Iterator[Routines]:
    with Routines(Settings(database_url=routines_url), clock=clock) as admin:
        yield admin


@pytest.fixture
def invoke(routines_url: str, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch):
    return cli_invoker(make_app(tmp_path / "broker", routines_url), clock, monkeypatch)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def every_kind(dcb: DCB) -> None:
    """One task of every schedule type django-celery-beat has, with every field set."""
    rome = dcb.schedule(
        "CrontabSchedule",
        minute="30",
        hour="2",
        day_of_week="*",
        day_of_month="*",
        month_of_year="*",
        timezone="Europe/Rome",
    )
    dcb.task(
        "nightly-rome",
        "tasks.report",
        crontab=rome,
        args='[1, "a"]',
        kwargs='{"x": 1}',
        queue="slow",
        exchange="reports",
        routing_key="reports.nightly",
        priority=5,
        headers='{"tenant": "acme"}',
        expire_seconds=300,
        description="the nightly report",
        start_time=utc(2026, 10, 1),
        last_run_at=utc(2026, 10, 24, 0, 30, 0, 400000),
    )
    dcb.task(
        "every-2h",
        crontab=None,
        interval=dcb.schedule("IntervalSchedule", every=2, period="hours"),
        last_run_at=NOW - timedelta(hours=1),
    )
    dcb.task(
        "sunrise-rome",
        solar=dcb.schedule("SolarSchedule", event="sunrise", latitude="41.9", longitude="12.5"),
    )
    dcb.task(
        "christmas-eve",
        one_off=True,
        clocked=dcb.schedule("ClockedSchedule", clocked_time=utc(2026, 12, 24, 17)),
    )
    weekdays = dcb.schedule(
        "CrontabSchedule",
        minute="0",
        hour="9",
        day_of_week="mon-fri",
        day_of_month="*",
        month_of_year="*",
        timezone="UTC",
    )
    dcb.task("once-at-nine", crontab=weekdays, one_off=True)
    dcb.task(
        "switched-off",
        enabled=False,
        interval=dcb.schedule("IntervalSchedule", every=10, period="minutes"),
    )
    dcb.task(
        "expired",
        expires=utc(2026, 10, 1),
        interval=dcb.schedule("IntervalSchedule", every=1, period="hours"),
    )


def test_every_schedule_type_and_field_is_mapped(
    dcb: DCB, database_url: str, tmp_path: Path, clock: FakeClock, monkeypatch
) -> None:
    every_kind(dcb)
    app = make_app(tmp_path / "broker", database_url)
    monkeypatch.setattr(commands, "CLOCK", clock)
    result = CliRunner().invoke(
        routines,
        ["import", "django-celery-beat", dcb.url],
        obj=cli_context(app),
        catch_exceptions=False,
    )
    out = ok(result)
    assert out.splitlines()[-1] == "django-celery-beat: 7 added, 0 not imported"
    with Routines(app, clock=clock) as admin:
        stored = {r.name: r for r in admin.store.routines.all()}
        assert set(stored) == {
            "nightly-rome",
            "every-2h",
            "sunrise-rome",
            "christmas-eve",
            "once-at-nine",
            "switched-off",
            "expired",
        }
        assert all(
            r.source == "import" and r.owner == "import:django-celery-beat" for r in stored.values()
        )
        nightly = stored["nightly-rome"]
        assert (nightly.task, nightly.cron, nightly.timezone) == (
            "tasks.report",
            "30 2 * * *",
            "Europe/Rome",
        )
        assert json.loads(nightly.args) == [1, "a"] and json.loads(nightly.kwargs) == {"x": 1}
        assert json.loads(nightly.options) == {
            "queue": "slow",
            "exchange": "reports",
            "routing_key": "reports.nightly",
            "priority": 5,
            "headers": {"tenant": "acme", "periodic_task_name": "nightly-rome"},
            "expires": 300,
        }
        assert nightly.starts_at == utc(2026, 10, 1) and nightly.ends_at is None
        assert nightly.catch_up == "latest" and nightly.enabled and not nightly.paused
        # 02:30 on the 25th in Rome (the autumn night) after the run of the 24th.
        assert nightly.next_run_at == utc(2026, 10, 25, 0, 30)
        assert stored["every-2h"].interval_seconds == 7200
        assert stored["every-2h"].next_run_at == NOW + timedelta(hours=1)
        assert stored["sunrise-rome"].solar == "sunrise 41.9 12.5"
        assert stored["christmas-eve"].at == utc(2026, 12, 24, 17)
        assert stored["christmas-eve"].cron is None
        once = stored["once-at-nine"]
        assert (once.cron, once.ends_at) == ("0 9 * * mon-fri", utc(2026, 10, 26, 9))
        assert stored["switched-off"].enabled is False
        assert stored["expired"].ends_at == utc(2026, 10, 1)
        # Never run by django-celery-beat: beat picks their first window.
        assert stored["sunrise-rome"].next_run_at is None
        history = admin.history("nightly-rome")
        assert history[0].action == "imported"
        assert history[0].detail["description"] == "the nightly report"
        states = {s.name: s.state for s in admin.list()}
        assert states["expired"] == "done" and states["switched-off"] == "disabled"


def test_a_crontab_in_rome_across_both_dst_nights(dcb: DCB, invoke, admin: Routines) -> None:
    rome = dict(
        minute="30",
        hour="2",
        day_of_week="*",
        day_of_month="*",
        month_of_year="*",
        timezone="Europe/Rome",
    )
    dcb.task(
        "autumn",
        crontab=dcb.schedule("CrontabSchedule", **rome),
        last_run_at=utc(2026, 10, 24, 0, 30, 1),
    )
    dcb.task(
        "spring",
        crontab=dcb.schedule("CrontabSchedule", **rome),
        last_run_at=utc(2026, 3, 28, 1, 30, 1),
    )  # 02:30 CET on the 28th
    ok(invoke("import", "django-celery-beat", dcb.url))
    autumn = [w.utc for w in admin.show("autumn", windows=3).next_windows]
    # 02:30 exists twice on 2026-10-25: it fires once, at 02:30 CEST.
    assert autumn == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30), utc(2026, 10, 27, 1, 30)]
    # 02:30 does not exist on 2026-03-29: it fires at 03:30 CEST.
    assert admin.store.routines.by_name("spring").next_run_at == utc(2026, 3, 29, 1, 30)


def test_a_task_run_an_hour_ago_does_not_fire_again(
    dcb: DCB, invoke, routines_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """django-celery-beat sent a one-off an hour ago and was stopped before it
    disabled the task (it does so at its next check): the row is still
    enabled, with last_run_at set. An interval task ran at the same time."""
    dcb.task(
        "one-off",
        one_off=True,
        clocked=dcb.schedule("ClockedSchedule", clocked_time=NOW - timedelta(hours=1)),
    )
    dcb.task("every-2h", interval=dcb.schedule("IntervalSchedule", every=2, period="hours"))
    ran = NOW - timedelta(hours=1) + timedelta(milliseconds=300)
    dcb.set("one-off", last_run_at=ran, total_run_count=1)
    dcb.set("every-2h", last_run_at=ran, total_run_count=7)
    ok(invoke("import", "django-celery-beat", dcb.url))
    folder = tmp_path / "beat-broker"
    scheduler = Scheduler(make_app(folder, routines_url), clock=clock)
    try:
        scheduler.tick()
        assert published(folder) == []  # neither fires again now
        clock.advance(minutes=59, seconds=59)
        scheduler.tick()
        assert published(folder) == []
        clock.advance(seconds=2)
        scheduler.tick()
        # The interval's next window, two hours after its last run; the one-off never.
        assert [m["task"] for m in published(folder)] == ["tasks.noop"]
        clock.advance(hours=3)
        scheduler.tick()
        assert len(published(folder)) == 2
    finally:
        scheduler.close()


def test_intervals_come_over_on_whole_seconds(dcb: DCB, invoke, admin: Routines) -> None:
    """The grid of windows (and their keys) is whole seconds: an interval in
    microseconds is rounded to the nearest second (one under a second is 1 s,
    never 0), and a last run's microseconds do not become the grid's."""
    micro = {"period": "microseconds"}
    dcb.task("one-and-a-half", interval=dcb.schedule("IntervalSchedule", every=1500000, **micro))
    dcb.task("tiny", interval=dcb.schedule("IntervalSchedule", every=300000, **micro))
    ran = NOW - timedelta(seconds=30) + timedelta(microseconds=123456)
    dcb.task(
        "every-minute",
        interval=dcb.schedule("IntervalSchedule", every=1, period="minutes"),
        last_run_at=ran,
        start_time=NOW - timedelta(days=1, microseconds=500),
    )
    ok(invoke("import", "django-celery-beat", dcb.url))
    stored = {r.name: r for r in admin.store.routines.all()}
    assert stored["one-and-a-half"].interval_seconds == 2.0
    assert stored["tiny"].interval_seconds == 1.0
    minute = stored["every-minute"]
    # 60 s after the last run, raised to its whole second: never before it.
    assert minute.next_run_at == NOW + timedelta(seconds=31)
    assert minute.starts_at == NOW - timedelta(days=1)
    keys = [w.idempotency_key for w in admin.show("every-minute", windows=2).next_windows]
    assert keys == [
        "every-minute@2026-10-24T12:00:31+00:00",
        "every-minute@2026-10-24T12:01:31+00:00",
    ]


def test_running_it_again_updates_and_never_duplicates(dcb: DCB, invoke, admin: Routines) -> None:
    every_kind(dcb)
    ok(invoke("import", "django-celery-beat", dcb.url))
    again = ok(invoke("import", "django-celery-beat", dcb.url))
    assert again.splitlines()[-1] == "django-celery-beat: 0 added, 7 unchanged, 0 not imported"
    nightly = dcb.models().PeriodicTask.objects.using(dcb.alias).get(name="nightly-rome")
    nightly.crontab.hour = "3"
    nightly.crontab.save(using=dcb.alias)
    dcb.set("nightly-rome", kwargs='{"x": 2}')
    out = ok(invoke("import", "django-celery-beat", dcb.url))
    assert (
        "updated       nightly-rome  next window 2026-10-24 01:30:00 UTC  (cron, kwargs, "
        "next_run_at)" in out
    )
    assert (
        out.splitlines()[-1] == "django-celery-beat: 0 added, 1 updated, 6 unchanged, "
        "0 not imported"
    )
    assert len(admin.list()) == 7
    record = admin.store.routines.by_name("nightly-rome")
    assert record.cron == "30 3 * * *" and json.loads(record.kwargs) == {"x": 2}
    assert [c.action for c in admin.history("nightly-rome")] == ["reimported", "imported"]


def test_a_routine_of_the_same_name_from_elsewhere_is_left_alone(
    dcb: DCB, invoke, admin: Routines
) -> None:
    dcb.task("poll", interval=dcb.schedule("IntervalSchedule", every=5, period="minutes"))
    dcb.task("other", interval=dcb.schedule("IntervalSchedule", every=5, period="minutes"))
    add_routine(admin.store, "poll", source="cli", cron="0 * * * *")
    result = invoke("import", "django-celery-beat", dcb.url)
    assert result.exit_code == 1
    assert (
        "not imported  poll: a routine of this name is already stored (cli, owner -): "
        "rename or delete one of them" in result.stdout
    )
    assert admin.store.routines.by_name("poll").cron == "0 * * * *"
    assert admin.store.routines.by_name("other").interval_seconds == 300


def test_unmappable_tasks_are_listed_and_the_rest_written_whole(
    dcb: DCB, invoke, admin: Routines, monkeypatch: pytest.MonkeyPatch
) -> None:
    every = dcb.schedule("IntervalSchedule", every=5, period="minutes")
    dcb.task("good", interval=every)
    dcb.task("bad-args", interval=every, args="[1, oops")
    first_monday = dcb.schedule(
        "CrontabSchedule",
        minute="0",
        hour="9",
        day_of_week="1",
        day_of_month="1-7",
        month_of_year="*",
        timezone="UTC",
    )
    dcb.task("first-monday", crontab=first_monday)
    dcb.task("fortnightly", interval=dcb.schedule("IntervalSchedule", every=1, period="fortnights"))
    result = invoke("import", "django-celery-beat", dcb.url)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert any(line.startswith("not imported  bad-args: its args are not JSON") for line in lines)
    assert any(line.startswith("not imported  first-monday: cannot convert") for line in lines)
    assert "not imported  fortnightly: its interval period 'fortnights' is unknown" in lines
    assert lines[-1] == "django-celery-beat: 1 added, 3 not imported"
    assert [s.name for s in admin.list()] == ["good"]


def test_a_bad_crontab_is_one_line_naming_the_task_and_the_value_and_nothing_is_lost(
    dcb: DCB, invoke, admin: Routines
) -> None:
    """A crontab row django-celery-beat's admin would refuse but its models
    save (save() runs no validators), and a zone written behind Django's back:
    each task is one line naming it and the value; the routine imported
    before the row broke stays exactly as stored."""
    nightly = dcb.schedule(
        "CrontabSchedule",
        minute="30",
        hour="2",
        day_of_week="*",
        day_of_month="*",
        month_of_year="*",
        timezone="Europe/Rome",
    )
    dcb.task("nightly", crontab=nightly, last_run_at=utc(2026, 10, 24, 0, 30, 1))
    dcb.task("fine", interval=dcb.schedule("IntervalSchedule", every=5, period="minutes"))
    ok(invoke("import", "django-celery-beat", dcb.url))
    before = admin.store.routines.by_name("nightly")
    nightly.minute = "61"
    nightly.save(using=dcb.alias)
    weekly = dcb.schedule(
        "CrontabSchedule",
        minute="0",
        hour="9",
        day_of_week="funday",
        day_of_month="*",
        month_of_year="*",
        timezone="UTC",
    )
    dcb.task("weekly", crontab=weekly)
    zoned = dcb.schedule("CrontabSchedule", minute="0", hour="8", timezone="UTC")
    dcb.task("on-mars", crontab=zoned)
    from django.db import connections

    def zone(name: str) -> None:  # the model would refuse to load the row back
        with connections[dcb.alias].cursor() as cursor:
            cursor.execute(
                "UPDATE django_celery_beat_crontabschedule SET timezone = %s WHERE id = %s",
                [name, zoned.id],
            )

    zone("Mars/Olympus")
    try:
        result = invoke("import", "django-celery-beat", dcb.url)
    finally:
        zone("UTC")
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stdout.splitlines()
    assert (
        "not imported  nightly: its crontab (minute '61', hour '2', day_of_month '*', "
        "month_of_year '*', day_of_week '*') does not read: Invalid end range: 61 > 59." in lines
    )
    assert (
        "not imported  weekly: its crontab (minute '0', hour '9', day_of_month '*', "
        "month_of_year '*', day_of_week 'funday') does not read: "
        "Invalid weekday literal 'funday'." in lines
    )
    assert (
        "not imported  on-mars: its crontab's timezone: unknown timezone 'Mars/Olympus': "
        "use an IANA name such as 'Europe/Rome' or 'UTC'" in lines
    )
    assert lines[-1] == "django-celery-beat: 0 added, 1 unchanged, 3 not imported"
    assert admin.store.routines.by_name("nightly") == before
    assert [c.action for c in admin.history("nightly")] == ["imported"]
    assert sorted(s.name for s in admin.list()) == ["fine", "nightly"]


def test_a_sqlite_datetime_that_is_not_one_is_that_tasks_line(
    dcb_databases: dict[str, str], invoke, admin: Routines
) -> None:
    """SQLite keeps any text in a datetime column: one such row is listed
    with the value, the other rows are still read (it was a traceback while
    fetching every row)."""
    from django.db import connections

    dcb = DCB("sqlite", dcb_databases["sqlite"])
    dcb.clear()
    every = dcb.schedule("IntervalSchedule", every=5, period="minutes")
    dcb.task("fine", interval=every)
    dcb.task("garbled", interval=every)
    with connections["sqlite"].cursor() as cursor:
        cursor.execute(
            "UPDATE django_celery_beat_periodictask SET last_run_at = %s WHERE name = %s",
            ["yesterday-ish", "garbled"],
        )
    try:
        result = invoke("import", "django-celery-beat", dcb.url)
    finally:
        dcb.models().PeriodicTask.objects.using("sqlite").filter(name="garbled").update(
            last_run_at=None
        )
        dcb.clear()
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stdout.splitlines()
    assert "not imported  garbled: its last_run_at is not a date and time: 'yesterday-ish'" in lines
    assert lines[-1] == "django-celery-beat: 1 added, 1 not imported"
    assert [s.name for s in admin.list()] == ["fine"]


def test_a_failure_while_writing_leaves_nothing_written(
    dcb: DCB, invoke, admin: Routines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The routines are inserted, then writing their history fails: the
    whole import is rolled back."""
    every_kind(dcb)
    from celery_routines.store.imports import ImportQueries

    insert_many, inserted = ImportQueries.insert_many, []

    def counted(self: ImportQueries, rows: Any) -> None:
        inserted.extend(rows)
        insert_many(self, rows)

    def failing(self: ImportQueries, *args: Any) -> None:
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(ImportQueries, "insert_many", counted)
    monkeypatch.setattr(ImportQueries, "record_changes", failing)
    with pytest.raises(RuntimeError):
        invoke("import", "django-celery-beat", dcb.url)
    assert len(inserted) == 7
    assert admin.list() == [] and recorded_changes(admin.store) == 0


def test_dry_run_prints_the_plan_and_writes_nothing(dcb: DCB, invoke, admin: Routines) -> None:
    every_kind(dcb)
    out = ok(invoke("import", "django-celery-beat", dcb.url, "--dry-run"))
    assert "added         every-2h  next window 2026-10-24 13:00:00 UTC" in out
    assert "added         once-at-nine  next window: the first after beat adopts it" in out
    assert "added         sunrise-rome  next window: the first after beat adopts it" in out
    assert (
        out.splitlines()[-1] == "django-celery-beat: 7 added, 0 not imported (dry run: "
        "nothing written)"
    )
    assert admin.list() == [] and recorded_changes(admin.store) == 0


def test_a_dry_run_needs_no_store_and_creates_no_file(
    dcb: DCB, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trying the import before anything else: no SQLite file yet. The dry
    run prints the plan (every entry added) and leaves no file behind."""
    every_kind(dcb)
    missing = tmp_path / "new" / "routines.db"
    missing.parent.mkdir()
    app = make_app(tmp_path / "broker", f"sqlite:///{missing}")
    invoke = cli_invoker(app, clock, monkeypatch)
    out = ok(invoke("import", "django-celery-beat", dcb.url, "--dry-run", "--disabled"))
    assert "added         every-2h  next window 2026-10-24 13:00:00 UTC" in out
    assert "the store has no tables yet" in out
    assert out.splitlines()[-1] == (
        "django-celery-beat: 7 added, 0 not imported (dry run: nothing written)"
    )
    assert list(missing.parent.iterdir()) == []


def test_an_import_keeps_the_old_schedulers_retries_and_overlap_unless_asked(
    dcb: DCB, invoke, admin: Routines
) -> None:
    """django-celery-beat never sends a failed task again and never holds a
    send back while the previous run goes on: an import keeps that, says so
    line by line, and --our-defaults gives ours."""
    every_kind(dcb)
    out = ok(invoke("import", "django-celery-beat", dcb.url))
    assert (
        "added         every-2h  next window 2026-10-24 13:00:00 UTC  retries 0, overlap overlap"
        in out
    )
    assert "retries and overlap kept as django-celery-beat had them" in out
    assert "--our-defaults gives celery-routines' (4 retries, overlap skip)" in out
    stored = admin.store.routines.all()
    assert {(r.max_retries, r.overlap) for r in stored} == {(0, "overlap")}
    ours = ok(invoke("import", "django-celery-beat", dcb.url, "--our-defaults"))
    assert (
        "updated       every-2h  next window 2026-10-24 13:00:00 UTC  (max_retries, overlap)"
        in ours
    )
    assert "celery-routines' defaults (max_retries 4, retry_base_seconds 60, overlap skip)" in ours
    stored = admin.store.routines.all()
    assert {(r.max_retries, r.retry_base_seconds, r.overlap) for r in stored} == {(4, 60, "skip")}


def test_disabled_imports_every_routine_paused(dcb: DCB, invoke, admin: Routines) -> None:
    every_kind(dcb)
    out = ok(invoke("import", "django-celery-beat", dcb.url, "--disabled", "--json"))
    assert {line["action"] for line in json.loads(out)["lines"]} == {"added"}
    assert all(r.paused for r in admin.store.routines.all())
    # The definition is unchanged: running it again without --disabled leaves them paused.
    ok(invoke("import", "django-celery-beat", dcb.url))
    assert all(r.paused for r in admin.store.routines.all())
    ok(invoke("resume", "every-2h"))
    assert not admin.store.routines.by_name("every-2h").paused


def test_a_routine_the_code_declares_too_is_resumed_when_the_code_takes_it_over(
    dcb: DCB, routines_url: str, tmp_path: Path, clock: FakeClock, monkeypatch
) -> None:
    """Celery's backend clean-up and the team's beat_schedule entries are in
    django-celery-beat's table too. Imported paused, the plan says beat takes
    them over and resumes them; beat does, except one an operator paused by
    hand with a reason. A routine only the import has stays paused."""
    daily = dcb.schedule("CrontabSchedule", minute="0", hour="4", timezone="UTC")
    dcb.task("celery.backend_cleanup", "celery.backend_cleanup", crontab=daily)
    dcb.task("reports", "tasks.report", crontab=daily)
    dcb.task("hourly", crontab=dcb.schedule("CrontabSchedule", minute="0", timezone="UTC"))
    code = {"reports": {"task": "tasks.report", "schedule": crontab("0", "4")}}
    app = make_app(tmp_path / "broker", routines_url, beat_schedule=code)
    invoke = cli_invoker(app, clock, monkeypatch)
    out = ok(invoke("import", "django-celery-beat", dcb.url, "--disabled"))
    lines = out.splitlines()
    resumes = (
        "              declared in code too: beat takes it over when it starts, with the "
        "code's definition, and resumes it"
    )
    notes = {
        lines[i - 1].split()[1]: line for i, line in enumerate(lines) if line.startswith("   ")
    }
    assert notes == {"celery.backend_cleanup": resumes, "reports": resumes}
    with Routines(Settings(database_url=routines_url), clock=clock) as admin:
        admin.resume("reports")
        admin.pause("reports", reason="the vendor's API is down")
        again = ok(invoke("import", "django-celery-beat", dcb.url, "--disabled", "--dry-run"))
        assert "with the code's definition; it stays paused (not paused by an import)" in again
        scheduler = Scheduler(
            make_app(tmp_path / "beat", routines_url, beat_schedule=code), clock=clock
        )
        try:
            scheduler.tick()
        finally:
            scheduler.close()
        stored = {r.name: r for r in admin.store.routines.all()}
        cleanup, reports = stored["celery.backend_cleanup"], stored["reports"]
        assert (cleanup.source, cleanup.paused, cleanup.paused_reason) == ("code", False, None)
        assert (reports.source, reports.paused) == ("code", True)
        assert reports.paused_reason == "the vendor's API is down"
        assert stored["hourly"].paused and stored["hourly"].source == "import"
        assert admin.history("celery.backend_cleanup")[0].action == "resumed"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://postgres@127.0.0.1:1/nothing", "cannot read postgresql://"),
        ("sqlite:////nonexistent/django.db", "no SQLite database file at '/nonexistent/django.db'"),
        ("not a url", "'not a url' is not a database URL"),
        ("redis://127.0.0.1/0", "'redis' databases are not read"),
    ],
)
def test_bad_source_is_one_line(invoke, url: str, expected: str) -> None:
    assert expected in one_error(invoke("import", "django-celery-beat", url))


def test_a_database_without_django_celery_beat_is_one_line(invoke, routines_url: str) -> None:
    line = one_error(invoke("import", "django-celery-beat", routines_url))
    assert "is not a django-celery-beat database: no table django_celery_beat_" in line


def test_the_switch_over_hands_over_where_the_old_beat_stopped(
    dcb: DCB, invoke, routines_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """docs/migrating.md's steps: import paused; the old beat keeps sending;
    stop it and import again; resume with --catch-up. Each window is sent once,
    by one of the two."""
    dcb.task("hourly", crontab=dcb.schedule("CrontabSchedule", minute="0", timezone="UTC"))
    dcb.set("hourly", last_run_at=NOW + timedelta(seconds=0.4))  # DCB sent 12:00
    ok(invoke("import", "django-celery-beat", dcb.url, "--disabled"))
    folder = tmp_path / "beat-broker"
    scheduler = Scheduler(make_app(folder, routines_url), clock=clock)
    try:
        clock.advance(hours=2, minutes=30)  # DCB sent 13:00 and 14:00 meanwhile
        scheduler.tick()
        assert published(folder) == []  # paused
        dcb.set("hourly", last_run_at=utc(2026, 10, 24, 14, 0, 0, 300000))
        out = ok(invoke("import", "django-celery-beat", dcb.url, "--disabled"))
        assert "updated       hourly  next window 2026-10-24 15:00:00 UTC  (next_run_at)" in out
        clock.advance(minutes=40)  # 15:10: the old beat is stopped; 15:00 was not sent
        ok(invoke("resume", "hourly", "--catch-up"))
        scheduler.tick()
        keys = [m["id"] for m in published(folder)]
        assert len(keys) == 1
        with Routines(Settings(database_url=routines_url), clock=clock) as admin:
            (run,) = admin.runs("hourly")
            assert run.scheduled_for == utc(2026, 10, 24, 15)
            # Our run history owns the next window now: importing again leaves it.
            dcb.set("hourly", last_run_at=utc(2026, 10, 24, 9))
            ok(invoke("import", "django-celery-beat", dcb.url))
            record = admin.store.routines.by_name("hourly")
            assert record.next_run_at == utc(2026, 10, 24, 16)
    finally:
        scheduler.close()
