"""``celery routines import redbeat REDIS_URL`` against entries written by
RedBeat's own ``RedBeatSchedulerEntry.save()`` in a throwaway Redis db."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab, schedule

from celery_routines.config import Settings
from celery_routines.operator.admin import Routines
from tests.conftest import FakeClock
from tests.operators import cli_invoker, make_app, ok

redbeat = pytest.importorskip("redbeat")

NOW = datetime(2026, 10, 24, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def redbeat_app(redis_url: str) -> Celery:
    app = Celery("redbeat_source", set_as_current=False)
    app.conf.update(redbeat_redis_url=redis_url, timezone="Europe/Rome")
    return app


@pytest.fixture
def routines_url(sqlite_url: str, migrated_schema: None) -> str:
    return sqlite_url


@pytest.fixture
def admin(routines_url: str, clock: FakeClock) -> Iterator[Routines]:
    with Routines(Settings(database_url=routines_url), clock=clock) as admin:
        yield admin


@pytest.fixture
def invoke(routines_url: str, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch):
    return cli_invoker(
        make_app(tmp_path / "broker", routines_url, timezone="Europe/Rome"), clock, monkeypatch
    )


def save(app: Celery, name: str, task: str, every: object, **fields: object) -> None:
    from redbeat.schedulers import RedBeatSchedulerEntry

    RedBeatSchedulerEntry(name, task, every, app=app, **fields).save()


def entries(app: Celery) -> None:
    from dateutil.rrule import MO
    from redbeat.schedules import rrule

    save(
        app,
        "nightly",
        "tasks.report",
        crontab(minute=30, hour=2),
        args=[1, "a"],
        kwargs={"x": 1},
        options={"queue": "slow", "priority": 3},
        last_run_at=datetime(2026, 10, 24, 0, 30, 0, 400000, tzinfo=UTC),
    )
    save(
        app,
        "every-2h",
        "tasks.poll",
        schedule(timedelta(hours=2)),
        last_run_at=NOW - timedelta(hours=1),
    )
    mondays = rrule(
        "WEEKLY",
        dtstart=datetime(2026, 11, 2, 9, 0, tzinfo=ZoneInfo("Europe/Rome")),
        byweekday=MO,
        count=3,
    )
    save(app, "three-mondays", "tasks.standup", mondays, last_run_at=NOW)
    save(
        app,
        "switched-off",
        "tasks.poll",
        schedule(timedelta(minutes=5)),
        enabled=False,
        last_run_at=NOW,
    )


def test_every_entry_is_mapped_and_its_first_window_follows_its_last_run(
    redbeat_app: Celery, redis_url: str, invoke, admin: Routines
) -> None:
    entries(redbeat_app)
    out = ok(invoke("import", "redbeat", redis_url))
    assert out.splitlines()[-1] == "redbeat: 4 added, 0 not imported"
    stored = {r.name: r for r in admin.store.routines.all()}
    nightly = stored["nightly"]
    assert (nightly.task, nightly.cron, nightly.timezone) == (
        "tasks.report",
        "30 2 * * *",
        "Europe/Rome",
    )
    assert json.loads(nightly.args) == [1, "a"] and json.loads(nightly.kwargs) == {"x": 1}
    assert json.loads(nightly.options) == {"queue": "slow", "priority": 3}
    assert nightly.owner == "import:redbeat" and nightly.catch_up == "latest"
    # The autumn night in Rome: 02:30 CEST, once.
    assert nightly.next_run_at == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    every = stored["every-2h"]
    assert every.interval_seconds == 7200
    assert every.next_run_at == NOW + timedelta(hours=1)
    mondays = stored["three-mondays"]
    assert mondays.rrule == "DTSTART:20261102T090000\nRRULE:FREQ=WEEKLY;COUNT=3;BYDAY=MO"
    assert mondays.timezone == "Europe/Rome"
    assert [w.utc for w in admin.show("three-mondays", windows=5).next_windows] == [
        datetime(2026, 11, 2, 8, tzinfo=UTC),
        datetime(2026, 11, 9, 8, tzinfo=UTC),
        datetime(2026, 11, 16, 8, tzinfo=UTC),
    ]
    assert stored["switched-off"].enabled is False


def test_intervals_come_over_on_whole_seconds(
    redbeat_app: Celery, redis_url: str, invoke, admin: Routines
) -> None:
    """A fractional interval is rounded to the nearest second, one under a
    second is 1 s (never 0), and a last run's microseconds stay out of the grid."""
    save(redbeat_app, "half", "tasks.poll", schedule(timedelta(milliseconds=500)))
    save(redbeat_app, "ninety", "tasks.poll", schedule(timedelta(seconds=89.6)),
         last_run_at=NOW + timedelta(microseconds=250000))  # fmt: skip
    ok(invoke("import", "redbeat", redis_url))
    stored = {r.name: r for r in admin.store.routines.all()}
    assert stored["half"].interval_seconds == 1.0
    assert stored["ninety"].interval_seconds == 90.0
    assert stored["ninety"].next_run_at == NOW + timedelta(seconds=91)


def test_an_import_keeps_redbeats_retries_and_overlap_unless_asked(
    redbeat_app: Celery, redis_url: str, invoke, admin: Routines
) -> None:
    entries(redbeat_app)
    out = ok(invoke("import", "redbeat", redis_url, "--dry-run"))
    assert "retries 0, overlap overlap" in out.splitlines()[0]
    assert "retries and overlap kept as redbeat had them" in out
    ok(invoke("import", "redbeat", redis_url))
    assert {(r.max_retries, r.overlap) for r in admin.store.routines.all()} == {(0, "overlap")}
    ok(invoke("import", "redbeat", redis_url, "--our-defaults"))
    assert {(r.max_retries, r.overlap) for r in admin.store.routines.all()} == {(4, "skip")}


def test_beat_schedule_copies_are_left_and_broken_entries_listed(
    redbeat_app: Celery, redis_url: str, invoke, admin: Routines
) -> None:
    import redis

    save(redbeat_app, "from-code", "tasks.poll", schedule(timedelta(minutes=1)))
    save(redbeat_app, "fine", "tasks.poll", schedule(timedelta(minutes=1)))
    client = redis.Redis.from_url(redis_url)
    client.sadd("redbeat::statics", "from-code")
    client.hset("redbeat:broken", "definition", "{not json")
    client.zadd("redbeat::schedule", {"redbeat:broken": 0, "redbeat:vanished": 0})
    client.close()
    result = invoke("import", "redbeat", redis_url, "--key-prefix", "redbeat:")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert (
        "left alone    from-code: a beat_schedule entry: our beat declares it from the "
        "code" in lines
    )
    assert any(
        line.startswith("not imported  broken: its definition is not JSON (Expecting property name")
        and line.endswith(": '{not json'")
        for line in lines
    )
    assert "not imported  vanished: redbeat:vanished is listed but has no definition" in lines
    assert lines[-1] == "redbeat: 1 added, 1 left alone, 2 not imported"
    assert [s.name for s in admin.list()] == ["fine"]


def test_again_changes_nothing_dry_run_writes_nothing_disabled_pauses(
    redbeat_app: Celery, redis_url: str, invoke, admin: Routines
) -> None:
    entries(redbeat_app)
    dry = ok(invoke("import", "redbeat", redis_url, "--dry-run"))
    assert "added         every-2h  next window 2026-10-24 13:00:00 UTC" in dry
    assert admin.list() == []
    ok(invoke("import", "redbeat", redis_url, "--disabled"))
    assert all(r.paused for r in admin.store.routines.all())
    again = ok(invoke("import", "redbeat", redis_url))
    assert again.splitlines()[-1] == "redbeat: 0 added, 4 unchanged, 0 not imported"
    assert len(admin.list()) == 4


def test_garbage_in_a_key_is_one_line_naming_the_entry_and_the_value(
    redbeat_app: Celery, redis_url: str, invoke, admin: Routines
) -> None:
    """Keys RedBeat would never write, next to an entry already imported and
    then broken: each is one line naming the entry and the value, the others
    are imported, and the routine already stored is left exactly as it was."""
    import redis

    save(redbeat_app, "poll", "tasks.poll", schedule(timedelta(minutes=1)), last_run_at=NOW)
    save(redbeat_app, "fine", "tasks.poll", schedule(timedelta(minutes=1)))
    ok(invoke("import", "redbeat", redis_url))
    before = admin.store.routines.by_name("poll")
    interval = {"__type__": "interval", "every": 60}
    client = redis.Redis.from_url(redis_url)
    broken = {  # name -> its definition
        "poll": '{"task": "tasks.poll", "schedule": {"__type__": "interval"',
        "a-list": "[1, 2]",
        "no-task": json.dumps({"schedule": interval}),
        "bad-every": '{"task": "t", "schedule": {"__type__": "interval", "every": "soon"}}',
        "bad-cron": '{"task": "t", "schedule": {"__type__": "crontab", "minute": "61"}}',
        "bad-args": json.dumps({"task": "t", "args": 5, "schedule": interval}),
        # dateutil's frequencies are 0 (yearly) to 6 (secondly).
        "bad-freq": json.dumps(
            {"task": "t", "schedule": {"__type__": "rrule", "freq": 9, "dtstart": 1.8e9}}
        ),
    }
    for name, definition in broken.items():
        client.hset(f"redbeat:{name}", "definition", definition)
        client.zadd("redbeat::schedule", {f"redbeat:{name}": 0})
    client.hset("redbeat:bad-meta", "definition", json.dumps({"task": "t", "schedule": interval}))
    client.hset("redbeat:bad-meta", "meta", "garbage")
    client.set("redbeat:a-string", "garbage")
    client.zadd("redbeat::schedule", {"redbeat:bad-meta": 0, "redbeat:a-string": 0})
    client.close()
    result = invoke("import", "redbeat", redis_url)
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stdout.splitlines()
    refused = {
        line.split(":", 1)[0].split()[-1]: line.split(": ", 1)[1]
        for line in lines
        if line.startswith("not imported")
    }
    assert refused["poll"].startswith("its definition is not JSON (")
    assert refused["poll"].endswith(
        """'{"task": "tasks.poll", "schedule": {"__type__": "interval"'"""
    )
    assert refused["a-list"] == "its definition must be a JSON object, got '[1, 2]'"
    assert refused["no-task"] == "its task must be a task name, got None"
    assert refused["bad-every"] == "its interval's every must be a number of seconds, got 'soon'"
    assert refused["bad-cron"] == (
        "its crontab {'minute': '61'} does not read: Invalid end range: 61 > 59."
    )
    assert refused["bad-args"] == "its args must be a JSON array, got 5"
    assert refused["bad-freq"].startswith("its rrule {'freq': 9, 'dtstart': 1800000000.0}")
    assert "freq 9 is not one of dateutil's 0 (yearly) to 6 (secondly)" in refused["bad-freq"]
    assert refused["bad-meta"].startswith("its meta is not JSON (") and refused[
        "bad-meta"
    ].endswith(": 'garbage'")
    assert refused["a-string"].startswith("redbeat:a-string is not a RedBeat hash: WRONGTYPE")
    assert lines[-1] == "redbeat: 0 added, 1 unchanged, 9 not imported"
    # Nothing stored is lost or changed by the broken key.
    assert admin.store.routines.by_name("poll") == before
    assert [c.action for c in admin.history("poll")] == ["imported"]
    assert [s.name for s in admin.list()] == ["fine", "poll"]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:1/0", "cannot read RedBeat's keys at redis://127.0.0.1:1/0"),
        ("nonsense://x", "'nonsense://x' is not a Redis URL"),
    ],
)
def test_bad_source_is_one_line(invoke, url: str, expected: str) -> None:
    result = invoke("import", "redbeat", url)
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert expected in line


def test_no_redbeat_under_the_prefix_is_one_line(invoke, redis_url: str) -> None:
    result = invoke("import", "redbeat", redis_url, "--key-prefix", "other")
    (line,) = result.stderr.strip().splitlines()
    assert "no RedBeat schedule under the key prefix 'other'" in line


def test_a_dry_run_on_no_store_at_all_prints_the_plan_and_creates_no_file(
    redbeat_app: Celery,
    redis_url: str,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries(redbeat_app)
    missing = tmp_path / "store" / "routines.db"
    missing.parent.mkdir()
    invoke = cli_invoker(make_app(tmp_path / "broker", f"sqlite:///{missing}"), clock, monkeypatch)
    out = ok(invoke("import", "redbeat", redis_url, "--dry-run", "--disabled"))
    assert out.splitlines()[0].startswith("added ")
    assert "the store has no tables yet" in out
    assert out.splitlines()[-1].endswith("(dry run: nothing written)")
    assert list(missing.parent.iterdir()) == []
