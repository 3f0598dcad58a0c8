"""#35 item 4: each routine option is declared once (a field of ``Routine``
made with ``option()``), and every door reads that declaration."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from celery_routines.operator.admin import Routines
from celery_routines.operator.cli import routines as routines_cli
from celery_routines.operator.cli_manage import CLI_OPTIONS
from celery_routines.operator.importers.files import KEYS
from celery_routines.operator.routine_form import BY_NAME
from celery_routines.operator.views import definition_of
from celery_routines.policy.options import RoutineOption
from celery_routines.policy.routine import OPTION_NAMES, OPTIONS, Routine, define
from celery_routines.policy.routine_rows import from_columns
from celery_routines.store import Store
from celery_routines.store.models import ROUTINES
from celery_routines.store.records import ROUTINE_RECORD_FIELDS
from tests.conftest import FakeClock
from tests.operators import make_app


def test_every_field_after_task_is_a_declared_option() -> None:
    fields = [f.name for f in dataclasses.fields(Routine)]
    assert fields[:2] == ["name", "task"]
    assert [o.name for o in OPTIONS] == fields[2:]


def test_every_option_has_its_column_in_the_table_and_in_the_record() -> None:
    """The table's column comes from the declaration; the record the store
    reads rows into must hold it too (else a stored value is never read)."""
    for declared in OPTIONS:
        assert declared.column_name in ROUTINES.c, declared.name
        assert declared.column_name in ROUTINE_RECORD_FIELDS, (
            f"RoutineRecord has no field {declared.column_name!r} for the option {declared.name!r}"
        )
        assert ROUTINES.c[declared.column_name].nullable == declared.stored.nullable


def test_an_option_taken_at_the_doors_is_worded_and_reaches_each_of_them() -> None:
    help_text = CliRunner().invoke(routines_cli, ["add", "--help"]).output
    entered = [o for o in OPTIONS if o.entry is not None]
    assert entered, "no option is taken at the CLI, the form and the API"
    for declared in entered:
        assert declared.label and declared.words, declared.name
        assert declared.cli_flag in help_text, declared.cli_flag
        assert declared in CLI_OPTIONS
        assert BY_NAME[str(declared.keyword_name)].label == declared.label
    for declared in OPTIONS:
        if declared.keyword_name:
            assert declared.keyword_name in OPTION_NAMES
            assert declared.keyword_name in KEYS, f"export/import loses {declared.name}"


def test_a_value_written_by_columns_reads_back_through_the_row_door() -> None:
    routine = define(
        "tasks.x", "30 2 * * 1-5", name="x", timezone="Europe/Rome", jitter=5,
        exclude=["2026-12-25"], shift="next_business_day", args=[1], kwargs={"a": 1},
        catch_up="latest", catch_up_cap=3, max_lateness=60, overlap="queue", max_retries=2,
        retry_base_seconds=5, run_timeout=30, pause_after_failures=3,
        notify_url="https://hooks.example.com/x",
    )  # fmt: skip
    row = type("Row", (), routine.columns())
    assert from_columns(row) == routine


def test_a_declaration_is_a_routine_option_with_its_field_name_and_default() -> None:
    by_name = {o.name: o for o in OPTIONS}
    assert isinstance(by_name["jitter"], RoutineOption)
    assert (by_name["jitter"].column_name, by_name["jitter"].default) == ("jitter_seconds", None)
    assert (by_name["ceilings"].keyword_name, by_name["ceilings"].cli_flag) == (
        "ceiling",
        "--ceiling",
    )
    assert by_name["catch_up_cap"].default == 25


@pytest.fixture
def admin(store: Store, database_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Routines]:
    routines = Routines(make_app(tmp_path / "broker", database_url), clock=clock)
    yield routines
    routines.close()


def test_an_edit_keeps_the_options_it_does_not_name(admin: Routines, store: Store) -> None:
    """Every stored option is the edit's base: a run_timeout set by SQL (no
    CLI flag) survived no edit before, as `current_options` left it out."""
    admin.add("poll", "tasks.poll", every="5m", notify_url="https://hooks.example.com/s/T1/key")
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE routines SET run_timeout = 90 WHERE name = 'poll'"))
    result = admin.edit("poll", max_retries=1)
    assert result.changed and set(result.fields) == {"max_retries"}
    record = store.routines.by_name("poll")
    assert record is not None
    assert (record.run_timeout, record.max_retries) == (90.0, 1)
    assert definition_of(record)["notify_url"] == "https://hooks.example.com/s/***"


def test_an_unknown_option_of_add_is_named(admin: Routines) -> None:
    with pytest.raises(TypeError, match="unknown routine option 'colour'"):
        admin.add("x", "tasks.x", every="5m", colour="red")


def test_a_mutable_default_is_made_for_each_routine() -> None:
    first, second = define("tasks.a", 60, name="a"), define("tasks.b", 60, name="b")
    assert first.kwargs == second.kwargs == {}
    assert first.kwargs is not second.kwargs and first.options is not second.options
