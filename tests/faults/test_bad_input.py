"""Issue 5, scenario 8: bad input from every door.

The decorator/register door is covered by tests/test_registry.py (cron, zone,
numbers, JSON, the 10,000-character name); here: what it misses, rows
inserted by plain SQL (beat is the only one who ever reads them), the
``celery routines`` command and the admin API.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError

from celery_routines import InvalidRoutine, Scheduler, register
from celery_routines.errors import RoutinesError
from celery_routines.operator.admin import Routines
from celery_routines.store import Store
from celery_routines.store.dialects import is_mysql
from tests.conftest import FakeClock
from tests.harness import (
    filesystem_app,
    insert_routine,
    migrated_store,
    published,
    runs_for,
    runs_of,
)
from tests.operators import Invoke, add_routine, cli_invoker, make_app

INJECTION = "x'; DROP TABLE routines; --"
LONG_NAME = "n" * 10_000


# -- the declaration door: what tests/test_registry.py does not cover yet ------


@pytest.mark.parametrize(
    ("schedule_value", "options", "expected"),
    [
        (float("inf"), {}, "inf"),
        (float("nan"), {}, "nan"),
        (timedelta(days=-1), {}, "-86400"),
        (10**30, {}, "1e+30"),
        ("0 3 * * * *", {}, "0 3 * * * *"),
        ("", {}, "''"),
        ("0 3 * * *", {"timezone": ""}, "''"),
        ("0 3 * * *", {"timezone": "../../etc/passwd"}, "../../etc/passwd"),
        ("0 3 * * *", {"max_lateness": -1}, "-1"),
        ("0 3 * * *", {"catch_up_cap": True}, "True"),
        ("0 3 * * *", {"max_retries": -1}, "-1"),
        ("0 3 * * *", {"retry_base_seconds": -60}, "-60"),
        ("0 3 * * *", {"args": "not-a-list"}, "not-a-list"),
        ("0 3 * * *", {"options": 5}, "5"),
        ("0 3 * * *", {"enabled": "yes"}, "yes"),
    ],
)
def test_more_bad_declarations_are_refused_naming_routine_and_value(
    schedule_value: object, options: dict[str, Any], expected: str
) -> None:
    with pytest.raises(InvalidRoutine) as excinfo:
        register("proj.task", schedule_value, name="the-routine", **options)
    message = str(excinfo.value)
    assert "the-routine" in message and expected in message, message


@pytest.mark.parametrize("name", ["", "   ", "two\nlines", "tab\there", 42])
def test_a_blank_or_multi_line_name_is_refused(name: object) -> None:
    with pytest.raises(InvalidRoutine):
        register("proj.task", 60, name=name)


def test_an_injection_looking_name_is_declared_as_a_plain_name() -> None:
    definition = register("proj.task", 60, name=INJECTION)
    assert definition.name == INJECTION


# -- rows inserted by plain SQL --------------------------------------------------

# (routine name, columns, a fragment its last_error must contain)
BAD_ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("bad-cron", {"cron": "61 * * * *"}, "'61 * * * *' is invalid: minute field '61' is out of "),
    ("bad-hour", {"cron": "0 24 * * *"}, "hour field '24' is out of range 0-23"),
    (
        "six-fields",
        {"cron": "0 3 * * * *"},
        "'0 3 * * * *' is invalid: it has 6 fields, expected 5",
    ),
    ("bad-zone", {"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "Mars/Olympus"),
    ("negative-interval", {"interval_seconds": -5.0}, "-5"),
    ("zero-interval", {"interval_seconds": 0.0}, "0"),
    ("absurd-interval", {"interval_seconds": 1e300}, "1e+300"),
    ("no-schedule", {}, "exactly one of cron, interval_seconds, at, solar, rrule or schedules"),
    ("both-schedules", {"cron": "* * * * *", "interval_seconds": 60.0}, "exactly one"),
    ("args-not-json", {"cron": "* * * * *", "args": "['single quotes']"}, "['single quotes']"),
    ("args-not-a-list", {"cron": "* * * * *", "args": '{"a": 1}'}, "{'a': 1}"),
    ("kwargs-not-a-dict", {"cron": "* * * * *", "kwargs": "[1, 2]"}, "[1, 2]"),
    ("options-not-json", {"cron": "* * * * *", "options": "{"}, "options"),
    ("bad-catch-up", {"cron": "* * * * *", "catch_up": "sometimes"}, "sometimes"),
    ("negative-cap", {"cron": "* * * * *", "catch_up_cap": -1}, "-1"),
    ("unknown-overlap", {"cron": "* * * * *", "overlap": "maybe"}, "maybe"),
    ("negative-lateness", {"cron": "* * * * *", "max_lateness": -5.0}, "-5"),
    ("bad-ceiling", {"cron": "* * * * *", "ceiling": "ten a day"}, "ten a day"),
]


def make_scheduler(folder: Path, database_url: str, clock: FakeClock) -> Scheduler:
    return Scheduler(filesystem_app(folder, database_url), clock=clock)


def stored_rows(store: Store) -> dict[str, dict[str, Any]]:
    """Every routine's user-owned columns (what beat must never change)."""
    runtime = {
        "next_run_at",
        "last_error",
        "locked_by",
        "locked_until",
        "updated_at",
        "suspended_until",
        "suspended_reason",
        # What next_run_at was computed from (beat's, like next_run_at).
        "schedule_fingerprint",
    }
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM routines")).mappings().all()
    return {
        row["name"]: {
            k: ("nan" if isinstance(v, float) and math.isnan(v) else v)
            for k, v in row.items()
            if k not in runtime
        }
        for row in rows
    }


def test_bad_sql_rows_get_last_error_naming_routine_and_value_and_block_nothing(
    database_url: str, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "broker"
    # No worker closes runs here: overlap="overlap" sends every window anyway.
    register("tasks.ok", timedelta(seconds=30), name="healthy", overlap="overlap")
    scheduler = make_scheduler(folder, database_url, clock)
    try:
        store = scheduler.store
        scheduler.tick()  # writes the declared routine
        for name, columns, _ in BAD_ROWS:
            insert_routine(store, name, enabled=True, **columns)
        insert_routine(store, INJECTION, cron="* * * * *", overlap="overlap")
        before = stored_rows(store)
        with caplog.at_level(logging.ERROR, logger="celery_routines.beat"):
            for _ in range(5 * 6):  # five minutes of ticks every 10 s
                clock.advance(seconds=10)
                assert scheduler.tick() > 0
        for name, _, fragment in BAD_ROWS:
            record = store.routines.by_name(name)
            assert record.last_error is not None, name
            assert repr(name) in record.last_error and fragment in record.last_error, (
                name,
                record.last_error,
            )
            assert runs_of(store, name) == [], name  # nothing was sent for it
            complaints = [r for r in caplog.records if repr(name) in r.getMessage()]
            assert 4 <= len(complaints) <= 6, (name, len(complaints))  # once a minute
        sent = published(folder)
        assert len([m for m in sent if m["routine"] == "healthy"]) == 10  # 12:00:30 .. 12:05:00
        assert len([m for m in sent if m["routine"] == INJECTION]) == 5  # 12:01 .. 12:05
        assert store.routines.by_name(INJECTION).last_error is None
        assert {m["routine"] for m in sent} == {"healthy", INJECTION}
        # Nothing the operator stored was changed or lost.
        assert stored_rows(store) == before
        assert {"routines", "routine_runs"} <= set(inspect(store.engine).get_table_names())
    finally:
        scheduler.close()


def test_a_row_fixed_by_the_operator_resumes_without_a_burst(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "broker"
    scheduler = make_scheduler(folder, database_url, clock)
    try:
        store = scheduler.store
        insert_routine(store, "args-fixed", cron="* * * * *", args="not json", overlap="overlap")
        for _ in range(6):
            clock.advance(minutes=1)
            scheduler.tick()
        assert "not json" in store.routines.by_name("args-fixed").last_error
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE routines SET args = '[\"fixed\"]' WHERE name = 'args-fixed'"))
        for _ in range(3):
            clock.advance(minutes=1)
            scheduler.tick()
        assert store.routines.by_name("args-fixed").last_error is None
        messages = published(folder)
        assert 1 <= len(messages) <= 2  # from the fix on, not the six minutes before
    finally:
        scheduler.close()


def test_a_ten_thousand_character_name_inserted_by_sql(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """PostgreSQL and MariaDB (strict mode, which the store's engine sets)
    refuse it at the INSERT (varchar(200)): nothing stored.
    SQLite does not enforce lengths: the row is stored whole and marked
    invalid with the declaration's own message; nothing is sent, truncated or
    corrupted."""
    folder = tmp_path / "broker"
    scheduler = make_scheduler(folder, database_url, clock)
    try:
        store = scheduler.store
        if store.engine.dialect.name == "postgresql" or is_mysql(store.engine):
            with pytest.raises(DBAPIError, match="too long"):
                insert_routine(store, LONG_NAME, cron="* * * * *")
            assert store.routines.by_name(LONG_NAME) is None
            return
        insert_routine(store, LONG_NAME, cron="* * * * *", overlap="overlap")
        for _ in range(2):
            clock.advance(minutes=1)
            scheduler.tick()
        record = store.routines.by_name(LONG_NAME)
        assert record is not None and len(record.name) == 10_000
        with pytest.raises(InvalidRoutine) as declared:
            register("tasks.noop", "* * * * *", name=LONG_NAME)
        assert record.last_error == str(declared.value)
        assert "at most 200" in record.last_error
        assert published(folder) == []
    finally:
        scheduler.close()


def test_an_unknown_task_name_is_sent_and_becomes_lost_then_retried_within_its_policy(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    """Beat cannot know which tasks the workers have: it sends the run. A
    worker logs "Received unregistered task" and drops the message, so the run
    stays ``sent`` until ``routines_run_timeout``, is declared lost and retried
    under the routine's policy, and ends ``lost``. Never a hot loop."""
    folder = tmp_path / "broker"
    app = filesystem_app(folder, database_url, routines_run_timeout=120)
    scheduler = Scheduler(app, clock=clock)
    try:
        store = scheduler.store
        insert_routine(
            store,
            "ghost-task",
            task="no.such.task",
            interval_seconds=3600.0,
            max_retries=2,
            retry_base_seconds=60.0,
        )
        scheduler.tick()  # first window 13:00
        clock.advance(minutes=59)
        for _ in range(30 * 6):  # half an hour of ticks every 10 s
            clock.advance(seconds=10)
            scheduler.tick()
        runs = runs_of(store, "ghost-task")
        assert {m["task"] for m in published(folder)} == {"no.such.task"}
        assert [(r["attempt"], r["state"], r["reason"]) for r in runs] == [
            (1, "failed", "lost"),
            (2, "failed", "lost"),
            (3, "lost", "lost"),
        ] or [(r["attempt"], r["state"]) for r in runs] == [
            (1, "lost"),
            (2, "lost"),
            (3, "lost"),
        ], runs
        # No worker has the task: no claim, so each attempt is lost as not started.
        assert "not started by" in runs[-1]["error"]
    finally:
        scheduler.close()


# -- the operator's doors: the CLI and the admin API -------------------------------


@pytest.fixture
def operator_store(database_url: str) -> Iterator[Store]:
    yield from migrated_store(database_url)


@pytest.fixture
def invoke(
    operator_store: Store,
    database_url: str,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> Invoke:
    return cli_invoker(make_app(tmp_path / "broker", database_url), clock, monkeypatch)


def one_line_error(result: Result, *fragments: str) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert lines, result.output
    for fragment in fragments:
        assert fragment in lines[-1], lines
    return lines[-1]


def test_cli_refuses_bad_arguments_with_one_line_naming_the_value(
    invoke: Invoke, operator_store: Store
) -> None:
    add_routine(operator_store, "good", cron="*/5 * * * *")
    before = stored_rows(operator_store)
    one_line_error(invoke("runs", "good", "--since", "yesterday-ish"), "yesterday-ish")
    one_line_error(invoke("skips", "--since", "1'; DROP TABLE routines; --"), "DROP TABLE")
    one_line_error(invoke("backfill", "good", "--from", "soon", "--to", "1h"), "soon")
    one_line_error(invoke("backfill", "good", "--from", "1h", "--to", "2h"))  # reversed
    one_line_error(invoke("show", "good", "-n", "not-a-number"), "not-a-number")
    one_line_error(invoke("show", LONG_NAME), "no routine named")
    one_line_error(invoke("pause", INJECTION), "no routine named")
    one_line_error(invoke("replay", "' OR '1'='1"), "' OR '1'='1")
    assert stored_rows(operator_store) == before
    assert not operator_store.routines.by_name("good").paused


@pytest.mark.parametrize(("option", "value"), [("-n", "-5"), ("-n", str(10**9))])
def test_cli_show_with_a_negative_or_absurd_count_answers_or_refuses_cleanly(
    invoke: Invoke, operator_store: Store, option: str, value: str
) -> None:
    add_routine(operator_store, "good", cron="*/5 * * * *")
    result = invoke("show", "good", option, value)
    if result.exit_code == 0:
        assert len(result.stdout.splitlines()) < 200
    else:
        one_line_error(result, value)


@pytest.mark.parametrize("limit", ["-1", "0", str(10**12)])
def test_cli_runs_with_a_negative_or_absurd_limit_answers_or_refuses_cleanly(
    invoke: Invoke, operator_store: Store, limit: str
) -> None:
    add_routine(operator_store, "good", cron="*/5 * * * *")
    result = invoke("runs", "--limit", limit, "--json")
    if result.exit_code == 0:
        assert json.loads(result.stdout) == []
    else:
        one_line_error(result, limit)


def test_admin_api_names_the_value_and_changes_nothing(
    operator_store: Store, database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    add_routine(operator_store, "good", cron="*/5 * * * *")
    add_routine(operator_store, "bad-args", cron="*/5 * * * *", args="{oops")
    before = stored_rows(operator_store)
    app = make_app(tmp_path / "broker", database_url)
    admin = Routines(app, clock=clock)
    try:
        for call, fragment in (
            (lambda: admin.show(INJECTION), INJECTION),
            (lambda: admin.show(LONG_NAME), "no routine named"),
            (lambda: admin.runs(since="next tuesday"), "next tuesday"),
            (lambda: admin.backfill("good", start="later", end="1h"), "later"),
            (lambda: admin.trigger("bad-args"), "{oops"),
        ):
            # The API's own errors, or ValueError for an unreadable instant.
            with pytest.raises((RoutinesError, ValueError)) as excinfo:
                call()
            assert fragment in str(excinfo.value), str(excinfo.value)
        assert published(tmp_path / "broker") == []
        assert stored_rows(operator_store) == before
        assert runs_for(operator_store, operator_store.routines.by_name("bad-args").id) == []
    finally:
        admin.close()
