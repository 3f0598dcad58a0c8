"""One routine model, two doors: every limit gives the same answer to a
routine declared in code and to a row typed into the ``routines`` table.

Each case is a limit and a value just past it, written once as a declaration
option and once as the column value; the declaration's ``InvalidRoutine``
message and the row's ``last_error`` after beat's first due tick must be the
same text. (``enabled`` and the name's length have no SQL case on both
databases: the column types refuse such values at the INSERT.)
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from celery_routines import Ceiling, InvalidRoutine, RoutinesError, Scheduler, register
from celery_routines.policy.option_values import SECONDS_LIMIT
from celery_routines.policy.routine import (
    CATCH_UP_CAP_LIMIT,
    JITTER_LIMIT,
    MAX_RETRIES_LIMIT,
    Routine,
    define,
)
from celery_routines.policy.routine_rows import from_columns
from celery_routines.policy.states import CatchUp, Overlap
from tests.conftest import FakeClock
from tests.harness import filesystem_app, insert_routine, published

NAME = "limits"


class Case:
    """A limit: the declaration option and the column that hold the value."""

    def __init__(self, id: str, option: str, code: Any, column: str, sql: Any) -> None:
        self.id, self.option, self.code, self.column, self.sql = id, option, code, column, sql


CASES = [
    Case("catch_up_cap=0", "catch_up_cap", 0, "catch_up_cap", 0),
    Case("catch_up_cap-negative", "catch_up_cap", -1, "catch_up_cap", -1),
    Case("catch_up_cap-over", "catch_up_cap", CATCH_UP_CAP_LIMIT + 1, "catch_up_cap", 100_001),
    Case("catch_up-unknown", "catch_up", "sometimes", "catch_up", "sometimes"),
    Case("overlap-unknown", "overlap", "maybe", "overlap", "maybe"),
    Case("max_lateness-zero", "max_lateness", 0.0, "max_lateness", 0.0),
    Case("max_lateness-negative", "max_lateness", -5.0, "max_lateness", -5.0),
    Case("max_lateness-over", "max_lateness", SECONDS_LIMIT + 1.0, "max_lateness", 31622401.0),
    Case("max_retries-negative", "max_retries", -1, "max_retries", -1),
    Case("max_retries-over", "max_retries", MAX_RETRIES_LIMIT + 1, "max_retries", 101),
    Case("retry_base-zero", "retry_base_seconds", 0.0, "retry_base_seconds", 0.0),
    Case("retry_base-negative", "retry_base_seconds", -60.0, "retry_base_seconds", -60.0),
    Case(
        "retry_base-over",
        "retry_base_seconds",
        SECONDS_LIMIT + 1.0,
        "retry_base_seconds",
        31622401.0,
    ),
    Case("run_timeout-zero", "run_timeout", 0.0, "run_timeout", 0.0),
    Case("run_timeout-negative", "run_timeout", -30.0, "run_timeout", -30.0),
    Case("run_timeout-under-a-second", "run_timeout", 0.5, "run_timeout", 0.5),
    Case("run_timeout-over", "run_timeout", SECONDS_LIMIT + 1.0, "run_timeout", 31622401.0),
    Case("pause_after_failures=0", "pause_after_failures", 0, "pause_after_failures", 0),
    Case("pause_after_failures-over", "pause_after_failures", 1001, "pause_after_failures", 1001),
    Case("notify_url-not-http", "notify_url", "ftp://hooks", "notify_url", "ftp://hooks"),
    Case("notify_url-no-host", "notify_url", "https:///hook", "notify_url", "https:///hook"),
    Case("notify_url-a-word", "notify_url", "slack", "notify_url", "slack"),
    Case("notify_url-spaces", "notify_url", " http://h/x ", "notify_url", " http://h/x "),
    Case("timezone-unknown", "timezone", "Mars/Olympus", "timezone", "Mars/Olympus"),
    Case("args-not-a-list", "args", {"a": 1}, "args", json.dumps({"a": 1})),
    Case("args-a-string", "args", "text", "args", json.dumps("text")),
    Case("kwargs-not-a-dict", "kwargs", [1, 2], "kwargs", json.dumps([1, 2])),
    Case("options-not-a-dict", "options", 5, "options", "5"),
    Case(
        "ceiling-two-per-unit",
        "ceiling",
        [Ceiling(5), Ceiling(6, per="hour")],
        "ceiling",
        json.dumps([{"limit": 5}, {"limit": 6, "per": "hour"}]),
    ),
    Case("name-line-break", "name", "two\nlines", "name", "two\nlines"),
    Case("name-blank", "name", "   ", "name", "   "),
    Case("task-blank", "task", " ", "task", " "),
]


def declared_message(case: Case) -> str:
    options = {"name": NAME, case.option: case.code}
    task = options.pop("task", "tasks.noop")
    with pytest.raises(InvalidRoutine) as raised:
        register(task, "* * * * *", **options)
    return str(raised.value)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_limit_gives_the_same_answer_in_code_and_in_sql(
    case: Case, database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    expected = declared_message(case)
    folder = tmp_path / "broker"
    scheduler = Scheduler(filesystem_app(folder, database_url), clock=clock)
    try:
        columns: dict[str, Any] = {"cron": "* * * * *", case.column: case.sql}
        name = columns.pop("name", NAME)
        insert_routine(scheduler.store, name, **columns)
        scheduler.tick()
        clock.advance(minutes=1)
        scheduler.tick()
        record = scheduler.store.routines.by_name(name)
        assert record.last_error == expected
        assert published(folder) == []
    finally:
        scheduler.close()


def test_catch_up_cap_zero_is_refused_at_declaration_not_at_the_first_due_tick() -> None:
    with pytest.raises(InvalidRoutine, match="catch_up_cap must be a whole number from 1 to"):
        register("tasks.noop", "* * * * *", name=NAME, catch_up_cap=0)


def test_a_bad_ceiling_is_refused_with_the_same_words_in_code_and_in_json() -> None:
    with pytest.raises(RoutinesError) as in_code:
        Ceiling(0)
    with pytest.raises(InvalidRoutine) as in_json:
        from_columns(_row(ceiling='{"limit": 0}'))
    assert in_json.value.problem == str(in_code.value)


# -- the model itself ------------------------------------------------------------------


def _row(**columns: Any) -> Any:
    """What ``from_columns`` reads: a row's attributes."""
    defaults: dict[str, Any] = {
        "name": NAME,
        "task": "tasks.noop",
        "cron": "* * * * *",
        "interval_seconds": None,
        "timezone": None,
        "enabled": True,
        "args": "[]",
        "kwargs": "{}",
        "options": "{}",
        "catch_up": "catch_up",
        "catch_up_cap": 25,
        "max_lateness": None,
        "overlap": "skip",
        "max_retries": 4,
        "retry_base_seconds": 60.0,
        "ceiling": None,
        "run_timeout": None,
    }

    class Row:
        pass

    row = Row()
    for key, value in {**defaults, **columns}.items():
        setattr(row, key, value)
    return row


def test_both_doors_build_equal_frozen_routines() -> None:
    code = define(
        "tasks.noop",
        "* * * * *",
        name=NAME,
        args=[1],
        kwargs={"a": 2},
        overlap="queue",
        catch_up="latest",
        ceiling=Ceiling(3),
        run_timeout=900,
    )
    row = from_columns(_row(**code.columns()))
    assert row.run_timeout == 900.0
    assert row == code
    assert row.overlap is Overlap.QUEUE and row.catch_up is CatchUp.LATEST
    with pytest.raises(AttributeError):
        row.catch_up_cap = 1  # type: ignore[misc]


def test_the_columns_store_todays_strings() -> None:
    columns = define("tasks.noop", 60, name=NAME, overlap="replace").columns()
    assert type(columns["overlap"]) is str and columns["overlap"] == "replace"
    assert type(columns["catch_up"]) is str and columns["catch_up"] == "catch_up"


def test_a_json_column_that_is_not_json_names_the_column_and_the_text() -> None:
    with pytest.raises(InvalidRoutine, match=r"args is not valid JSON .*'\[oops'"):
        from_columns(_row(args="[oops"))


def test_a_routine_can_be_built_directly_and_is_checked_the_same_way() -> None:
    with pytest.raises(InvalidRoutine, match="catch_up_cap must be a whole number"):
        Routine(NAME, "tasks.noop", "* * * * *", None, None, catch_up_cap=0)


# -- the schedule kinds and bounds of issue 16, at both doors ------------------------------

DAY = datetime(2026, 12, 24)


class KindCase:
    """A declaration (schedule and options) and the row with the same values."""

    def __init__(self, id: str, schedule: Any, options: dict[str, Any], sql: dict[str, Any]):
        self.id, self.schedule, self.options, self.sql = id, schedule, options, sql


KIND_CASES = [
    KindCase("jitter-zero", "* * * * *", {"jitter": 0}, {"cron": "* * * * *", "jitter_seconds": 0}),
    KindCase(
        "jitter-negative", "* * * * *", {"jitter": -5}, {"cron": "* * * * *", "jitter_seconds": -5}
    ),
    KindCase(
        "jitter-over",
        "* * * * *",
        {"jitter": JITTER_LIMIT + 1},
        {"cron": "* * * * *", "jitter_seconds": JITTER_LIMIT + 1},
    ),
    KindCase(
        "ends-before-starts",
        "* * * * *",
        {"starts_at": "2026-12-25T00:00+00:00", "ends_at": "2026-12-24T00:00+00:00"},
        {"cron": "* * * * *", "starts_at": DAY.replace(day=25), "ends_at": DAY},
    ),
    KindCase(
        "cron-and-at",
        "* * * * *",
        {"at": "2026-12-24T00:00+00:00"},
        {"cron": "* * * * *", "at": DAY},
    ),
    KindCase(
        "rrule-without-dtstart",
        "RRULE:FREQ=DAILY;BYHOUR=9",
        {},
        {"rrule": "RRULE:FREQ=DAILY;BYHOUR=9"},
    ),
    KindCase(
        "at-at-the-end-of-time",
        None,
        {"at": "9999-06-01T00:00+00:00"},
        {"at": DAY.replace(year=9999, month=6, day=1)},
    ),
]


@pytest.mark.parametrize("case", KIND_CASES, ids=[c.id for c in KIND_CASES])
def test_a_schedule_kind_limit_gives_the_same_answer_in_code_and_in_sql(
    case: KindCase, database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    with pytest.raises(InvalidRoutine) as raised:
        register("tasks.noop", case.schedule, name=NAME, **case.options)
    folder = tmp_path / "broker"
    scheduler = Scheduler(filesystem_app(folder, database_url), clock=clock)
    try:
        insert_routine(scheduler.store, NAME, **case.sql)
        scheduler.tick()
        clock.advance(minutes=1)
        scheduler.tick()
        record = scheduler.store.routines.by_name(NAME)
        assert record.last_error == str(raised.value)
        assert published(folder) == []
    finally:
        scheduler.close()


def test_the_new_fields_round_trip_through_the_columns() -> None:
    code = define(
        "tasks.noop",
        None,
        name=NAME,
        at="2026-12-24T18:00",
        timezone="Europe/Rome",
        starts_at="2026-12-01T00:00",
        ends_at="2026-12-31T00:00Z",
        jitter=30,
    )
    assert code.at == DAY.replace(hour=17, tzinfo=UTC)
    assert code.starts_at == datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    columns = code.columns()
    assert columns["jitter_seconds"] == 30
    assert from_columns(_row(**{**columns, "cron": None})) == code


def test_rows_that_differ_only_in_their_name_share_one_validation_and_keep_their_names() -> None:
    first = from_columns(_row(name="burst-1", args="[1, 2]"))
    second = from_columns(_row(name="burst-2", args="[1, 2]"))
    assert (first.name, second.name) == ("burst-1", "burst-2")
    assert second == Routine("burst-2", "tasks.noop", "* * * * *", None, None, args=[1, 2])
    with pytest.raises(AttributeError):
        second.name = "other"  # type: ignore[misc]


def test_a_shared_validation_still_checks_each_rows_name() -> None:
    from_columns(_row(name="fine"))
    with pytest.raises(InvalidRoutine, match="control characters"):
        from_columns(_row(name="two\nlines"))
    with pytest.raises(InvalidRoutine, match="name must be a non-empty string"):
        from_columns(_row(name="  "))


def test_a_value_equal_to_a_validated_one_but_of_another_type_is_checked_again() -> None:
    """True == 1 and 25 == 25.0 in Python: the cache is keyed by type too."""
    from_columns(_row(enabled=True, catch_up_cap=25))
    with pytest.raises(InvalidRoutine, match="enabled must be True or False"):
        from_columns(_row(enabled=1))
    with pytest.raises(InvalidRoutine, match="catch_up_cap must be a whole number"):
        from_columns(_row(catch_up_cap=25.0))


def test_a_row_that_fails_validation_is_refused_every_time_not_cached() -> None:
    for name in ("bad-1", "bad-2"):
        with pytest.raises(InvalidRoutine, match=f"routine {name!r}.*catch_up_cap"):
            from_columns(_row(name=name, catch_up_cap=0))


def test_a_routines_own_notify_url_is_a_column_and_a_bad_one_names_the_routine_and_value() -> None:
    url = "https://hooks.example.com/routines?team=ops"
    definition = define("tasks.noop", "* * * * *", name=NAME, notify_url=url)
    assert definition.notify_url == url and definition.columns()["notify_url"] == url
    assert from_columns(_row(notify_url=url)).notify_url == url
    assert from_columns(_row()).notify_url is None  # unset: routines_notify_url
    with pytest.raises(InvalidRoutine) as raised:
        define("tasks.noop", "* * * * *", name=NAME, notify_url="hooks.example.com/x?t=0k")
    # The value is named as show prints it: the error lands in the log, the
    # panel and the API, and the token must not.
    assert str(raised.value) == (
        f"routine {NAME!r}: notify_url must be an http:// or https:// URL with a host "
        "(e.g. https://hooks.example.com/routines), got 'hooks.example.com/***?***'"
    )
