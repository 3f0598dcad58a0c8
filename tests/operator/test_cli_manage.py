"""``celery routines add | edit | enable | disable | delete | history | prune``
through Click's runner, on every store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from celery_routines import register
from celery_routines.store import Store
from celery_routines.store.declarations import IMPORT_PAUSE_REASON
from celery_routines.store.models import ROUTINES
from tests.conftest import FakeClock
from tests.operators import add_routine, add_run, cli_invoker, make_app, ok, one_error


@pytest.fixture
def invoke(store: Store, database_url: str, tmp_path: Path, clock: FakeClock, monkeypatch):
    return cli_invoker(make_app(tmp_path / "broker", database_url), clock, monkeypatch)


def test_add_edit_disable_enable_delete_and_history(invoke, store: Store) -> None:
    out = ok(
        invoke(
            "add",
            "poll",
            "tasks.poll",
            "--every",
            "5m",
            "--tz",
            "Europe/Rome",
            "--args",
            "[1]",
            "--kwargs",
            '{"a": 2}',
            "--queue",
            "slow",
            "--catch-up",
            "latest",
            "--overlap",
            "queue",
            "--max-lateness",
            "10m",
            "--ceiling",
            "100/day",
            "--ceiling",
            "3 eur/month",
            "--by",
            "ana",
        )
    )
    assert out.startswith('added poll: task="tasks.poll"')
    record = store.routines.by_name("poll")
    assert record is not None and record.source == "cli" and record.options == '{"queue": "slow"}'
    edited = json.loads(ok(invoke("edit", "poll", "--cron", "*/10 * * * *", "--json")))
    assert edited["fields"] == {"cron": "*/10 * * * *", "interval_seconds": None}
    assert "nothing changed" in ok(invoke("edit", "poll", "--cron", "*/10 * * * *"))
    assert ok(invoke("disable", "poll")).startswith("disabled poll")
    assert ok(invoke("enable", "poll")).startswith("enabled poll")
    history = json.loads(ok(invoke("history", "poll", "--json")))
    assert [h["action"] for h in history] == ["enabled", "disabled", "edited", "added"]
    assert history[-1]["changed_by"] == "ana" and "@" in history[0]["changed_by"]
    assert "deleted poll and its 0 run(s)" in ok(invoke("delete", "poll", "--yes"))
    assert "deleted" in ok(invoke("history", "poll"))


def test_bad_values_get_the_declaration_messages_in_one_line(invoke) -> None:
    line = one_error(invoke("add", "x", "tasks.x", "--cron", "61 * * * *"))
    assert line.startswith("Error: routine 'x': ") and "61" in line
    assert "--args must be JSON" in one_error(
        invoke("add", "x", "tasks.x", "--every", "1m", "--args", "[1")
    )
    assert "--ceiling must look like" in one_error(
        invoke("add", "x", "tasks.x", "--every", "1m", "--ceiling", "lots")
    )
    assert "--cron EXPR, --every DURATION or --at" in one_error(invoke("add", "x", "tasks.x"))
    assert "no routine named 'nope'" in one_error(invoke("enable", "nope"))


def test_a_code_routine_is_refused_with_where_it_is_declared(
    invoke, store: Store, clock: FakeClock
) -> None:
    definition = register("proj.tasks.nightly", "0 3 * * *", name="nightly")
    store.routines.upsert_definitions([definition.columns()], clock(), owner="proj")
    line = one_error(invoke("edit", "nightly", "--cron", "0 4 * * *"))
    assert "declared in the code of app 'proj'" in line and "task proj.tasks.nightly" in line
    assert "pause" in one_error(invoke("delete", "nightly"))
    # Retired, it can be deleted.
    store.routines.upsert_definitions([], clock(), owner="proj", stamp="9")
    out = ok(invoke("list"))
    assert "retired (no longer declared in code since 2026-11-30" in out
    assert "retired (no longer declared in code since" in ok(invoke("show", "nightly"))
    assert "deleted nightly" in ok(invoke("delete", "nightly", "--yes"))


def test_prune_prints_counts_per_state_and_keeps_what_is_needed(
    invoke,
    store: Store,
    clock: FakeClock,
) -> None:
    old = clock.now - timedelta(days=40)
    routine = add_routine(store, "poll")
    capped = add_routine(store, "capped", ceiling='[{"limit": 5, "per": "month", "unit": "fires"}]')
    for i, state in enumerate(["succeeded", "succeeded", "failed", "skipped", "running", "lost"]):
        add_run(
            store,
            routine,
            f"poll@{i}",
            state,
            old + timedelta(minutes=i),
            old + timedelta(minutes=i),
        )
    # Newest run of poll: old, finished, kept anyway.
    newest = add_run(
        store, routine, "poll@last", "succeeded", old + timedelta(hours=1), old + timedelta(hours=1)
    )
    # capped: a run of this month is counted by its monthly ceiling (kept with
    # --older-than 1d), last month's is not.
    this_month = datetime(2026, 11, 10, tzinfo=UTC)
    add_run(store, capped, "capped@1", "succeeded", this_month, this_month)
    add_run(store, capped, "capped@0", "succeeded", old, old)
    add_run(store, capped, "capped@2", "succeeded", clock.now, clock.now)
    dry = ok(invoke("prune", "--dry-run"))
    assert dry.startswith("would delete 6 finished run(s)") and "3 succeeded" in dry
    assert len(store.admin.runs(limit=100)) == 10
    result = json.loads(ok(invoke("prune", "--older-than", "1d", "--json")))
    assert result["deleted"] == {"succeeded": 3, "failed": 1, "skipped": 1, "lost": 1}
    left = {named.run.idempotency_key for named in store.admin.runs(limit=100)}
    assert left == {"poll@4", "poll@last", "capped@1", "capped@2"}
    assert newest in {named.run.id for named in store.admin.runs(limit=100)}
    assert "deleted 0 finished run(s)" in ok(invoke("prune"))


def test_sync_retires_what_the_code_no_longer_declares_and_says_so(
    invoke,
    store: Store,
    clock: FakeClock,
) -> None:
    from celery_routines.registry import forget

    register("tasks.a", "* * * * *", name="a")
    register("tasks.b", "* * * * *", name="b")
    ok(invoke("sync"))
    forget("b")
    clock.advance(seconds=1)
    out = ok(invoke("sync"))
    assert "  b  retired: no longer declared in code" in out.splitlines()
    assert json.loads(ok(invoke("history", "b", "--json")))[0]["action"] == "retired"
    register("tasks.b", "* * * * *", name="b")
    clock.advance(minutes=5)
    assert "  b  (back in service)" in ok(invoke("sync")).splitlines()
    record = store.routines.by_name("b")
    assert record is not None and record.retired_at is None


def test_sync_resumes_a_routine_only_the_import_paused_and_says_so(invoke, store: Store) -> None:
    add_routine(store, "a", source="import", paused=True, paused_reason=IMPORT_PAUSE_REASON)
    add_routine(store, "b", source="import", paused=True, paused_reason="by hand")
    register("tasks.a", "* * * * *", name="a")
    register("tasks.b", "* * * * *", name="b")
    lines = ok(invoke("sync")).splitlines()
    assert "  a  (taken over from the import, which had paused it: resumed)" in lines
    assert "  b" in lines
    assert not store.routines.by_name("a").paused and store.routines.by_name("b").paused
    assert json.loads(ok(invoke("history", "a", "--json")))[0]["action"] == "resumed"


def test_pause_and_resume_are_in_the_history_with_who(invoke, store: Store) -> None:
    add_routine(store, "poll")
    ok(invoke("pause", "poll", "--by", "ops-bot"))
    ok(invoke("resume", "poll"))
    history = json.loads(ok(invoke("history", "poll", "--json")))
    assert [(h["action"], h["changed_by"]) for h in history][1] == ("paused", "ops-bot")
    assert history[0]["action"] == "resumed" and "@" in history[0]["changed_by"]


def test_add_a_one_off_and_a_bounded_jittered_routine_then_edit_them(invoke, store: Store) -> None:
    out = ok(
        invoke("add", "xmas", "tasks.greet", "--at", "2026-12-24T18:00", "--tz", "Europe/Rome")
    )
    assert out.startswith("added xmas")
    record = store.routines.by_name("xmas")
    assert record.at == datetime(2026, 12, 24, 17, 0, tzinfo=UTC) and record.cron is None
    ok(
        invoke(
            "add",
            "poll",
            "tasks.poll",
            "--every",
            "5m",
            "--starts-at",
            "2026-12-01T00:00Z",
            "--ends-at",
            "2026-12-31T00:00Z",
            "--jitter",
            "30",
        )
    )
    poll = store.routines.by_name("poll")
    assert (poll.starts_at, poll.ends_at, poll.jitter_seconds) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2026, 12, 31, tzinfo=UTC),
        30,
    )
    edited = json.loads(ok(invoke("edit", "poll", "--jitter", "60", "--json")))
    assert edited["fields"] == {"jitter_seconds": 60}
    # A one-off moved to another instant keeps being a one-off; its bounds stay.
    edited = json.loads(ok(invoke("edit", "xmas", "--at", "2026-12-25T09:00Z", "--json")))
    assert edited["fields"] == {"at": "2026-12-25T09:00:00+00:00"}
    assert store.routines.by_name("poll").starts_at == datetime(2026, 12, 1, tzinfo=UTC)
    # Limits are the declaration's, in one line.
    line = one_error(invoke("add", "bad", "tasks.x", "--every", "1m", "--jitter", "0"))
    assert line == "Error: routine 'bad': jitter must be a whole number from 1 to 86400, got 0"
    line = one_error(invoke("add", "bad", "tasks.x", "--at", "soon"))
    assert "at must be an ISO 8601 date and time" in line
    # Without --tz a local time is read in routines_timezone (UTC here).
    ok(invoke("add", "noon", "tasks.x", "--at", "2026-12-24T12:00"))
    assert store.routines.by_name("noon").at == datetime(2026, 12, 24, 12, 0, tzinfo=UTC)


def test_add_and_edit_take_pause_after_failures_and_a_notify_url_that_show_prints(
    invoke, store: Store
) -> None:
    hook = "https://hooks.example.com/payroll"
    out = ok(
        invoke(
            "add", "payroll", "tasks.payroll", "--cron", "0 9 25 * *", "--tz", "Europe/Rome",
            "--exclude", "holidays:IT", "--shift", "previous_business_day",
            "--pause-after-failures", "3", "--notify-url", hook,
        )
    )  # fmt: skip
    assert "pause_after_failures=3" in out and f'notify_url="{hook}"' in out
    record = store.routines.by_name("payroll")
    assert (record.pause_after_failures, record.notify_url) == (3, hook)
    with store.engine.begin() as conn:  # as an automatic pause writes it
        conn.execute(
            update(ROUTINES)
            .where(ROUTINES.c.name == "payroll")
            .values(paused=True, paused_reason="paused after 3 consecutive final failures")
        )
    shown = ok(invoke("show", "payroll")).splitlines()
    # The calendar and the alerting fields, each on its own line, one column.
    assert "  exclude:               holidays:IT" in shown
    assert "  shift:                 previous_business_day" in shown
    assert "  pause_after_failures:  3" in shown
    assert "  paused_reason:         paused after 3 consecutive final failures" in shown
    assert f"  notify_url:            {hook}" in shown
    detail = json.loads(ok(invoke("show", "payroll", "--json")))
    assert detail["definition"]["notify_url"] == hook

    # Editing another field keeps both (the stored definition is the edit's base).
    ok(invoke("edit", "payroll", "--overlap", "queue"))
    record = store.routines.by_name("payroll")
    assert (record.pause_after_failures, record.notify_url) == (3, hook)
    # A new endpoint is not a new schedule: the next window stays.
    before = record.next_run_at
    edited = json.loads(ok(invoke("edit", "payroll", "--notify-url", hook + "2", "--json")))
    assert edited["fields"] == {"notify_url": hook + "2"}
    assert store.routines.by_name("payroll").next_run_at == before
    # 0 and 'none' clear them: never pause, routines_notify_url again.
    edited = json.loads(
        ok(invoke("edit", "payroll", "--pause-after-failures", "0", "--notify-url", "none",
                  "--json"))
    )  # fmt: skip
    assert edited["fields"] == {"pause_after_failures": None, "notify_url": None}
    record = store.routines.by_name("payroll")
    assert (record.pause_after_failures, record.notify_url) == (None, None)
    assert "  notify_url:            not set" in ok(invoke("show", "payroll")).splitlines()


def test_a_bad_notify_url_is_one_line_naming_the_routine_and_the_value(
    invoke, store: Store
) -> None:
    line = one_error(
        invoke("add", "x", "tasks.x", "--every", "1m", "--notify-url", "hooks.example.com/x/t0k")
    )
    assert line.startswith("Error: routine 'x': notify_url must be an http:// or https:// URL")
    # Named as it is shown (its token masked): the error is printed and logged.
    assert "'hooks.example.com/***'" in line and "t0k" not in line
    assert store.routines.by_name("x") is None
    refused = invoke("add", "x", "tasks.x", "--every", "1m", "--pause-after-failures", "-1")
    assert one_error(refused) == (
        "Error: routine 'x': pause_after_failures must be a whole number from 1 to 1000, got -1"
    )


def test_a_password_in_a_notify_url_is_not_shown(invoke, store: Store) -> None:
    ok(invoke("add", "x", "tasks.x", "--every", "1m", "--notify-url", "https://u:s3cret@h/x"))
    assert store.routines.by_name("x").notify_url == "https://u:s3cret@h/x"
    text = ok(invoke("show", "x")) + ok(invoke("history", "x", "--json"))
    assert "s3cret" not in text and "https://u:***@h/x" in text


def test_a_webhook_token_in_a_notify_url_is_not_shown(invoke, store: Store) -> None:
    slack = "https://hooks.slack.com/services/T01/B02/tok3n"
    ok(invoke("add", "x", "tasks.x", "--every", "1m", "--notify-url", slack))
    ok(invoke("add", "y", "tasks.y", "--every", "1m", "--notify-url", "https://h/in?token=tok3n"))
    assert store.routines.by_name("x").notify_url == slack
    text = "".join(
        ok(invoke(*c)) for c in (["show", "x"], ["show", "y"], ["history", "x", "--json"])
    )
    assert "tok3n" not in text
    assert "https://hooks.slack.com/services/***" in text and "https://h/in?***" in text


def test_run_timeout_is_set_changed_and_cleared_from_the_cli(invoke, store: Store) -> None:
    """run_timeout was an option of code and SQL only; declared with an
    entry, it is a flag of add and edit (and a field of the form and API)."""
    ok(invoke("add", "sync", "tasks.sync", "--every", "5m", "--run-timeout", "90s"))
    assert store.routines.by_name("sync").run_timeout == 90.0
    ok(invoke("edit", "sync", "--run-timeout", "2h"))
    assert store.routines.by_name("sync").run_timeout == 7200.0
    ok(invoke("edit", "sync", "--max-retries", "1"))
    assert store.routines.by_name("sync").run_timeout == 7200.0  # kept by another edit
    ok(invoke("edit", "sync", "--run-timeout", "none"))
    assert store.routines.by_name("sync").run_timeout is None
    line = one_error(invoke("edit", "sync", "--run-timeout", "0.5s"))
    assert line.startswith("Error: routine 'sync': run_timeout must be at least 1 second")
    line = one_error(invoke("edit", "sync", "--run-timeout", "soon"))
    assert "run_timeout" in line and "'soon'" in line
    assert store.routines.by_name("sync").run_timeout is None
