"""``celery routines ...`` through Click's runner on SQLite and PostgreSQL, and
once through a real ``celery -A ... routines`` subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import inspect

from celery_routines.operator import commands
from celery_routines.operator.cli import routines
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.e2e import processes
from tests.harness import published
from tests.operators import Invoke, add_routine, add_run, cli_context, cli_invoker, make_app, ok

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def broker_folder(tmp_path: Path) -> Path:
    return tmp_path / "broker"


@pytest.fixture
def invoke(
    store: Store,
    database_url: str,
    broker_folder: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> Invoke:
    """Run a ``celery routines`` command as Celery would, with the app in ctx.obj."""
    return cli_invoker(make_app(broker_folder, database_url), clock, monkeypatch)


def fails_with(result: Result, *fragments: str) -> str:
    """A non-zero exit with exactly one clean line on stderr."""
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_list_prints_a_table_and_json(invoke: Invoke, store: Store) -> None:
    record = add_routine(
        store,
        "nightly",
        cron="30 2 * * *",
        timezone="Europe/Rome",
        next_run_at=datetime(2026, 12, 1, 1, 30, tzinfo=UTC),
    )
    add_run(store, record, "nightly@a", "succeeded", NOW, NOW)
    add_routine(store, "poll", cron=None, interval_seconds=60.0, paused=True)

    table = ok(invoke("list"))
    assert table.splitlines()[0].split() == [
        "NAME",
        "SCHEDULE",
        "TIMEZONE",
        "NEXT",
        "RUN",
        "(UTC)",
        "NEXT",
        "RUN",
        "(LOCAL)",
        "STATE",
        "LAST",
        "NEXT",
        "RETRY",
        "(UTC)",
    ]
    assert "2026-12-01 01:30:00 UTC" in table and "2026-12-01 02:30:00 CET" in table
    assert "paused" in table and "succeeded" in table

    listed = json.loads(ok(invoke("list", "--json")))
    assert [(r["name"], r["state"]) for r in listed] == [("nightly", "enabled"), ("poll", "paused")]
    assert listed[0]["next_run_local"] == "2026-12-01T02:30:00+01:00"
    assert listed[0]["last_outcome"] == "succeeded"


def test_list_shows_the_next_run_of_a_routine_beat_has_not_scheduled_yet(
    invoke: Invoke, store: Store
) -> None:
    """Imported paused, or a one-off just added: no next_run_at is stored
    until beat adopts it, and list gives the window show lists."""
    add_routine(store, "nightly-rome", cron="0 9 * * *", timezone="Europe/Rome", paused=True)
    add_routine(
        store, "once", cron=None, at=datetime(2026, 12, 24, 11, 0, 30, tzinfo=UTC),
        timezone="Europe/Rome",
    )  # fmt: skip
    add_routine(store, "gone", cron="0 9 * * *", retired_at=NOW)

    rows = {line.split()[0]: line for line in ok(invoke("list")).splitlines()[1:]}
    assert "paused (would be next: 2026-12-01 08:00:00 UTC)" in rows["nightly-rome"]
    assert "(would be next: 2026-12-01 09:00:00 CET)" in rows["nightly-rome"]
    assert rows["once"].split()[5:10] == ["2026-12-24", "11:00:30", "UTC", "2026-12-24", "12:00:30"]
    listed = {r["name"]: r for r in json.loads(ok(invoke("list", "--json")))}
    assert listed["nightly-rome"]["next_run_utc"] == "2026-12-01T08:00:00+00:00"
    assert listed["nightly-rome"]["state"] == "paused"
    assert listed["once"]["next_run_local"] == "2026-12-24T12:00:30+01:00"
    assert listed["gone"]["next_run_utc"] is None  # retired: it never fires
    shown = json.loads(ok(invoke("show", "nightly-rome", "--json", "-n", "1")))
    assert shown["next_windows"][0]["utc"] == listed["nightly-rome"]["next_run_utc"]


def test_show_and_list_agree_on_where_beat_would_start_a_routine(
    invoke: Invoke, store: Store, clock: FakeClock
) -> None:
    """A one-off whose instant passed before beat adopted it still fires once
    (at adoption), and an interval starts from the whole second."""
    clock.now = NOW + timedelta(microseconds=250000)
    add_routine(store, "late", cron=None, at=NOW - timedelta(hours=1))
    add_routine(store, "poll", cron=None, interval_seconds=30.0)
    listed = {r["name"]: r["next_run_utc"] for r in json.loads(ok(invoke("list", "--json")))}
    assert listed == {"late": "2026-11-30T11:00:00+00:00", "poll": "2026-11-30T12:00:30+00:00"}
    for name in listed:
        shown = json.loads(ok(invoke("show", name, "--json", "-n", "2")))
        assert shown["next_windows"][0]["utc"] == listed[name]


def test_show_prints_the_definition_and_next_windows_with_dst_marks(
    invoke: Invoke, store: Store, clock: FakeClock
) -> None:
    clock.now = datetime(2026, 10, 20, tzinfo=UTC)
    add_routine(
        store,
        "nightly",
        cron="30 2 * * *",
        timezone="Europe/Rome",
        next_run_at=datetime(2026, 10, 23, 0, 30, tzinfo=UTC),
        ceiling=json.dumps([{"limit": 5, "per": "week", "unit": "fires"}]),
    )
    text = ok(invoke("show", "nightly"))
    assert "2026-10-25 02:30:00 CEST  (first of two 02:30s)" in text
    assert "0 of 5 fires per week" in text
    assert "catch_up:" in text

    detail = json.loads(ok(invoke("show", "nightly", "--json", "-n", "3")))
    assert [w["note"] for w in detail["next_windows"]] == [None, None, "first of two 02:30s"]
    assert detail["ceilings"][0]["limit"] == 5


def test_runs_filters_and_rejects_a_bad_since(invoke: Invoke, store: Store) -> None:
    record = add_routine(store, "report")
    failed = add_run(store, record, "report@a", "failed", NOW, NOW - timedelta(hours=1))
    add_run(store, record, "report@b", "succeeded", NOW, NOW - timedelta(days=3))

    assert failed in ok(invoke("runs", "report"))
    rows = json.loads(ok(invoke("runs", "--state", "failed", "--since", "1d", "--json")))
    assert [r["id"] for r in rows] == [failed]
    assert json.loads(ok(invoke("runs", "--since", "2026-11-30T11:30", "--json"))) == []
    assert len(json.loads(ok(invoke("runs", "--limit", "1", "--json")))) == 1
    fails_with(invoke("runs", "--since", "last tuesday"), "'last tuesday' is not a date")
    assert invoke("runs", "--state", "exploded").exit_code != 0  # click's own choice check


def test_skips_lists_reason_and_count(invoke: Invoke, store: Store) -> None:
    record = add_routine(store, "report")
    add_run(
        store,
        record,
        "report@a..b",
        "skipped",
        NOW,
        NOW - timedelta(hours=2),
        reason="catch_up_cap",
        skipped_count=12,
    )
    add_run(store, record, "report@c", "skipped", NOW, NOW - timedelta(days=2), reason="overlap")
    text = ok(invoke("skips"))
    assert "catch_up_cap" in text and "12" in text and "overlap" in text
    recent = json.loads(ok(invoke("skips", "--since", "1d", "--json")))
    assert [(s["reason"], s["skipped_count"]) for s in recent] == [("catch_up_cap", 12)]
    fails_with(invoke("skips", "--since", "2026-13-45"), "'2026-13-45' is not a date")


def test_pause_and_resume(invoke: Invoke, store: Store, clock: FakeClock) -> None:
    add_routine(store, "poll", next_run_at=NOW + timedelta(minutes=5))
    assert "paused poll" in ok(invoke("pause", "poll"))
    assert "already paused" in ok(invoke("pause", "poll"))
    clock.advance(hours=1)
    text = ok(invoke("resume", "poll"))
    assert "resumed poll; next window 2026-11-30 13:05:00 UTC" in text
    assert "12 window(s) missed while paused recorded as skipped" in text
    assert json.loads(ok(invoke("resume", "poll", "--json")))["changed"] is False
    help_text = ok(invoke("resume", "--help"))
    assert "never" in help_text and "--catch-up" in help_text


def test_trigger_sends_one_message_with_a_manual_key(
    invoke: Invoke, store: Store, broker_folder: Path
) -> None:
    add_routine(store, "report")
    result = json.loads(ok(invoke("trigger", "report", "--json")))
    [message] = published(broker_folder)
    assert message["id"] == result["run_id"]
    assert message["routine_window"].startswith("report@manual:")
    assert "sent report@manual:" in ok(invoke("trigger", "report", "--force"))
    assert len(published(broker_folder)) == 2


def test_trigger_refused_by_the_overlap_policy_is_one_line(
    invoke: Invoke, store: Store, broker_folder: Path
) -> None:
    record = add_routine(store, "report")
    add_run(store, record, "report@a", "sent", NOW, NOW)
    fails_with(invoke("trigger", "report"), "open run", "--force")
    assert published(broker_folder) == []
    ok(invoke("trigger", "report", "--force"))
    assert len(published(broker_folder)) == 1


def test_replay_resends_a_failed_run_as_attempt_two(
    invoke: Invoke, store: Store, broker_folder: Path
) -> None:
    record = add_routine(store, "report")
    failed = add_run(store, record, "report@w", "failed", NOW, NOW)
    assert "report@w attempt 2 of 5" in ok(invoke("replay", failed))
    assert [m["routine_attempt"] for m in published(broker_folder)] == [2]
    fails_with(invoke("replay", failed), "already has attempt 2")
    fails_with(invoke("replay", "nope"), "no run with id 'nope'")


def test_backfill_twice_sends_nothing_the_second_time(
    invoke: Invoke, store: Store, broker_folder: Path
) -> None:
    add_routine(store, "hourly", cron="0 * * * *", timezone="Europe/Rome")
    args = ("backfill", "hourly", "--from", "2026-11-30T06:00", "--to", "2026-11-30T09:00")
    one = ok(invoke(*args, "--overlap", "skip"))
    assert (
        "hourly: 4 window(s) from 2026-11-30 05:00:00 UTC to 2026-11-30 08:00:00 UTC: "
        "1 sent, 0 already stored, 0 failed; 3 left unsent (overlap=skip sends one" in one
    )
    fails_with(invoke(*args), "wait for it to finish or pass --force")  # its run is open
    fails_with(invoke(*args, "--overlap", "all"), "--overlap must be 'skip', 'queue'")
    args = (*args, "--overlap", "overlap")
    text = ok(invoke(*args))
    assert "hourly: 4 window(s) from" in text and "3 sent, 1 already stored, 0 failed" in text
    expected = [f"hourly@2026-11-30T0{h}:00:00+01:00" for h in (6, 7, 8, 9)]
    # Oldest first is the order of the output; the broker folder only orders
    # its files to the millisecond.
    sent = [line.split()[1] for line in text.splitlines() if line.startswith("sent ")]
    assert sent == expected[1:]
    assert sorted(m["routine_window"] for m in published(broker_folder)) == expected
    again = json.loads(ok(invoke(*args, "--json")))
    assert (again["sent"], again["existing"]) == (0, 4)
    assert len(published(broker_folder)) == 4
    fails_with(
        invoke("backfill", "hourly", "--from", "2026-01-01", "--to", "2026-11-30"),
        "windows; at most 1000",
    )
    fails_with(invoke("backfill", "hourly", "--from", "1h", "--to", "2027-01-01"), "future")


def test_unknown_routine_is_one_line_naming_it_for_every_command(invoke: Invoke) -> None:
    for command in ("show", "pause", "resume", "trigger", "runs"):
        fails_with(invoke(command, "ghost"), "no routine named 'ghost'")
    fails_with(
        invoke("backfill", "ghost", "--from", "2h", "--to", "1h"), "no routine named 'ghost'"
    )


def test_a_name_that_looks_like_sql_is_stored_and_listed_as_is(
    invoke: Invoke, store: Store
) -> None:
    name = "x'; DROP TABLE routines; --"
    add_routine(store, name)
    assert [r["name"] for r in json.loads(ok(invoke("list", "--json")))] == [name]
    ok(invoke("pause", name))
    ok(invoke("show", name))
    fails_with(invoke("show", "' OR 1=1 --"), "no routine named")
    assert {"routines", "routine_runs"} <= set(inspect(store.engine).get_table_names())
    assert store.routines.by_name(name).paused


def test_migrate_creates_the_schema_and_is_idempotent(
    database_url: str, broker_folder: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(broker_folder, database_url)
    monkeypatch.setattr(commands, "CLOCK", clock)
    runner = CliRunner()
    first = runner.invoke(routines, ["migrate"], obj=cli_context(app), catch_exceptions=False)
    assert "migrated from empty to" in ok(first)
    second = runner.invoke(
        routines, ["migrate", "--json"], obj=cli_context(app), catch_exceptions=False
    )
    report = json.loads(ok(second))
    assert report["before"] == report["after"]


def test_a_missing_sqlite_folder_says_which_folder_to_create(
    tmp_path: Path, broker_folder: Path
) -> None:
    app = make_app(broker_folder, f"sqlite:///{tmp_path}/missing/dir/routines.db")
    result = CliRunner().invoke(routines, ["list"], obj=cli_context(app), catch_exceptions=False)
    fails_with(result, "cannot be opened", f"mkdir -p {tmp_path}/missing/dir")
    assert "migrate" not in result.stderr


def test_preview_works_without_a_database_or_an_app() -> None:
    runner = CliRunner()
    result = runner.invoke(
        routines,
        ["preview", "30 2 * * *", "--tz", "Europe/Rome", "--from", "2026-03-28", "-n", "2"],
        catch_exceptions=False,
    )
    assert "2026-03-29 03:30:00 CEST  (shifted: 02:30 does not exist)" in ok(result)
    windows = json.loads(
        ok(
            runner.invoke(
                routines, ["preview", "0 9 * * 1-5", "-n", "3", "--json", "--from", "2026-11-27"]
            )
        )
    )
    assert [w["utc"] for w in windows] == [
        "2026-11-27T09:00:00+00:00",
        "2026-11-30T09:00:00+00:00",
        "2026-12-01T09:00:00+00:00",
    ]
    fails_with(runner.invoke(routines, ["preview", "61 * * * *"]), "'61 * * * *' is invalid")
    fails_with(
        runner.invoke(routines, ["preview", "* * * * *", "--tz", "Nowhere/City"]),
        "unknown timezone 'Nowhere/City'",
    )
    fails_with(
        runner.invoke(routines, ["preview", "* * * * *", "--from", "tomorrow"]),
        "'tomorrow' is not a date",
    )


@pytest.mark.e2e
def test_a_real_celery_subprocess_runs_the_registered_sub_command(
    store: Store, database_url: str
) -> None:
    add_routine(store, "from-sql", cron="15 3 * * *", timezone="Asia/Tokyo")
    env = processes.environment("memory://", database_url)

    def celery(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "e2e_app", "routines", *args],
            cwd=processes.HERE,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    listed = celery("list", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert (row["name"], row["schedule"], row["timezone"]) == (
        "from-sql",
        "15 3 * * *",
        "Asia/Tokyo",
    )
    missing = celery("show", "ghost")
    assert missing.returncode != 0
    assert "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines() == ["Error: no routine named 'ghost' is stored"]


def test_a_send_the_broker_refuses_exits_1_with_one_line_and_is_recorded(
    store: Store, database_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.harness import redis_app

    add_routine(store, "report")
    app = redis_app("redis://127.0.0.1:1/0", database_url)
    monkeypatch.setattr(commands, "CLOCK", clock)
    result = CliRunner().invoke(
        routines, ["trigger", "report"], obj=cli_context(app), catch_exceptions=False
    )
    fails_with(result, "1 run(s) could not be sent", "retried under the routine's retry policy")
    [run] = store.admin.runs(states=["retrying"])
    assert run.run.reason == "send_failed"


def test_an_unmigrated_database_says_to_run_migrate(database_url: str, broker_folder: Path) -> None:
    app = make_app(broker_folder, database_url)
    result = CliRunner().invoke(routines, ["list"], obj=cli_context(app), catch_exceptions=False)
    line = fails_with(result, "the schema of", "is missing or older", "routines migrate")
    assert "does not exist on" not in line and "cannot connect" not in line


@pytest.mark.postgres
def test_a_missing_postgres_database_says_create_it_not_migrate(
    postgres_url: str, broker_folder: Path
) -> None:
    # The server is up (postgres_url's was just created); this name is not.
    missing = postgres_url.rsplit("/", 1)[0] + "/routines_never_created"
    app = make_app(broker_folder, missing)
    for command in ("list", "migrate"):
        result = CliRunner().invoke(
            routines, [command], obj=cli_context(app), catch_exceptions=False
        )
        line = fails_with(
            result,
            "the database 'routines_never_created' does not exist on 127.0.0.1:5432",
            "createdb",
        )
        assert "migrate" not in line, line


def test_an_unreachable_server_says_where_and_masks_the_password(broker_folder: Path) -> None:
    # Port 1 on loopback: nothing listens there, so the connection is refused.
    app = make_app(broker_folder, "postgresql://app:s3cret-pw@127.0.0.1:1/app")
    for command in ("list", "migrate"):
        result = CliRunner().invoke(
            routines, [command], obj=cli_context(app), catch_exceptions=False
        )
        line = fails_with(
            result, "cannot connect to the database server at 127.0.0.1:1: is it running"
        )
        assert "s3cret-pw" not in result.output and "app:***@127.0.0.1:1" in line
        assert "migrate" not in line and "does not exist" not in line


def test_sync_writes_the_routines_declared_in_code_so_they_can_be_listed(
    invoke: Invoke, store: Store
) -> None:
    from celery_routines import register

    register("tasks.report", "30 2 * * *", name="declared", timezone="Europe/Rome")
    # (celery.backend_cleanup too: Celery's own beat installs it for this app)
    assert "  declared" in ok(invoke("sync")).splitlines()
    rows = {row["name"]: row for row in json.loads(ok(invoke("list", "--json")))}
    assert (rows["declared"]["schedule"], rows["declared"]["timezone"]) == (
        "30 2 * * *",
        "Europe/Rome",
    )
    assert "declared" in json.loads(ok(invoke("sync", "--json")))["routines"]
    assert "no runs yet" in ok(invoke("show", "declared"))


# -- issue 17: retries are visible; words that do not read as "it will fire" ---


def test_retrying_runs_show_their_retry_time_and_attempt_everywhere(
    invoke: Invoke, store: Store
) -> None:
    record = add_routine(store, "report", max_retries=4, next_run_at=NOW + timedelta(hours=1))
    soon, later = NOW + timedelta(minutes=2), NOW + timedelta(minutes=8)
    add_run(store, record, "report@a", "retrying", NOW, NOW, attempt=2, retry_at=later)
    first = add_run(store, record, "report@b", "retrying", NOW, NOW, retry_at=soon)

    table = ok(invoke("runs", "report"))
    assert table.splitlines()[0].split()[:7] == [
        "RUN",
        "ID",
        "ROUTINE",
        "WINDOW",
        "ATTEMPT",
        "STATE",
        "RETRY",
    ]
    assert "2 of 5" in table and "1 of 5" in table
    assert "2026-11-30 12:02:00 UTC" in table and "2026-11-30 12:08:00 UTC" in table
    rows = {r["id"]: r for r in json.loads(ok(invoke("runs", "report", "--json")))}
    assert rows[first]["retry_at"] == soon.isoformat()
    assert rows[first]["max_attempts"] == 5

    shown = ok(invoke("show", "report"))
    assert "  open runs:             2 (2 retrying)" in shown.splitlines()
    assert "  next retry:            2026-11-30 12:02:00 UTC, attempt 2 of 5 of report@b" in shown
    assert "attempt 3 of 5 of report@a" in shown
    detail = json.loads(ok(invoke("show", "report", "--json")))
    assert detail["open_runs"] == 2
    assert [r["retry_at"] for r in detail["retrying"]] == [soon.isoformat(), later.isoformat()]

    listed = ok(invoke("list"))
    assert "NEXT RETRY (UTC)" in listed.splitlines()[0]
    assert listed.splitlines()[1].endswith("2026-11-30 12:02:00 UTC")
    [summary] = json.loads(ok(invoke("list", "--json")))
    assert summary["next_retry_at"] == soon.isoformat()


def test_pause_and_list_do_not_read_as_it_will_still_fire(
    invoke: Invoke, store: Store, clock: FakeClock
) -> None:
    add_routine(store, "poll", next_run_at=NOW + timedelta(minutes=5))
    add_routine(
        store,
        "broken",
        cron="61 * * * *",
        next_run_at=NOW + timedelta(minutes=1),
        last_error="routine 'broken': minute field '61' is out of range 0-59",
    )
    text = ok(invoke("pause", "poll"))
    assert text.strip() == "paused poll (would be next: 2026-11-30 12:05:00 UTC)"
    assert "next window" not in text

    lines = {line.split()[0]: line for line in ok(invoke("list")).splitlines()[1:]}
    assert "invalid, re-checked at 2026-11-30 12:01:00 UTC" in lines["broken"]
    assert "paused (would be next: 2026-11-30 12:05:00 UTC)" in lines["poll"]


def test_show_prints_fields_in_words_with_one_indentation_and_the_effective_zone(
    invoke: Invoke, store: Store
) -> None:
    add_routine(
        store,
        "report",
        cron="0 9 * * *",
        ceiling=json.dumps([{"limit": 5, "per": "week", "unit": "fires"}]),
        kwargs=json.dumps({"dry_run": True, "region": None}),
    )
    text = ok(invoke("show", "report"))
    fields = [line for line in text.splitlines() if line.startswith("  ") and ":" in line]
    # (not the window and spend lines, which start with a number)
    fields = [line for line in fields if not line[2].isdigit()]
    # Every field at one indentation, its value in one column (after the
    # longest option name, pause_after_failures).
    assert {(line.index(":") < 24, line[24], line[25] != " ") for line in fields} == {
        (True, " ", True)
    }
    assert {len(line) - len(line.lstrip()) for line in fields} == {2}
    assert "null" not in text and "true" not in text and "false" not in text
    assert "  timezone:              UTC (routines_timezone)" in text.splitlines()
    assert "  enabled:               yes" in text.splitlines()
    assert "  max_lateness:          not set" in text.splitlines()
    assert "  args:                  none" in text.splitlines()
    assert "  kwargs:                {'dry_run': True, 'region': None}" in text.splitlines()
    assert "  ceiling:               5 fires per week" in text.splitlines()


def test_preview_checks_a_calendar_before_it_is_saved() -> None:
    """The two examples of issue 34, to the day."""
    runner = CliRunner()

    def dates(*args: str) -> list[str]:
        windows = json.loads(ok(runner.invoke(routines, ["preview", *args, "--json"])))
        return [w["local"][:10] for w in windows]

    assert dates(
        "0 9 * * 1-5",
        "--tz",
        "Europe/Rome",
        "--from",
        "2026-12-21",
        "-n",
        "6",
        "--exclude",
        "holidays:IT",
    ) == ["2026-12-21", "2026-12-22", "2026-12-23", "2026-12-24", "2026-12-28", "2026-12-29"]
    payroll = [
        "0 9 25 * *",
        "--tz",
        "Europe/Rome",
        "--from",
        "2026-04-01",
        "-n",
        "3",
        "--exclude",
        "holidays:IT",
        "--shift",
        "previous_business_day",
    ]
    assert dates(*payroll) == ["2026-04-24", "2026-05-25", "2026-06-25"]
    text = ok(runner.invoke(routines, ["preview", *payroll]))
    assert "2026-04-24 09:00:00 CEST  (moved from Sat 2026-04-25, Liberation Day)" in text
    # Repeatable, and every kind of entry at once.
    assert dates(
        "0 9 * * *",
        "--tz",
        "Europe/Rome",
        "--from",
        "2026-12-22",
        "-n",
        "3",
        "--exclude",
        "2026-12-23",
        "--exclude",
        "2026-12-25..2026-12-27",
        "--exclude",
        "* * 28 12 *",
    ) == ["2026-12-22", "2026-12-24", "2026-12-29"]
    fails_with(
        runner.invoke(routines, ["preview", "0 9 * * *", "--exclude", "holidays:XX"]),
        "exclude 'holidays:XX': Country XX not available",
    )
    fails_with(
        runner.invoke(routines, ["preview", "0 9 * * *", "--exclude", "2026-13-01"]),
        "exclude entry '2026-13-01'",
    )
    fails_with(
        runner.invoke(routines, ["preview", "0 9 * * *", "--shift", "sideways"]),
        "shift must be 'next_business_day' or 'previous_business_day' (or unset), got 'sideways'",
    )
