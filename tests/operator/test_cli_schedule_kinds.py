"""``celery routines add/edit`` take every option the panel's form does
(issue 33): an rrule, a solar event, retries and the catch-up cap."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from celery_routines.operator import commands
from celery_routines.operator.cli import routines
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.operators import cli_context, make_app

RULE = "DTSTART:20260105T090000\nRRULE:FREQ=WEEKLY;BYDAY=MO"


@pytest.fixture
def invoke(store: Store, database_url: str, tmp_path: Path, clock: FakeClock, monkeypatch):
    app = make_app(tmp_path / "broker", database_url)
    monkeypatch.setattr(commands, "CLOCK", clock)

    def run(*args: str) -> Result:
        return CliRunner().invoke(routines, list(args), obj=cli_context(app))

    return run


def test_add_and_edit_take_rrule_solar_retries_and_the_catch_up_cap(invoke, store: Store) -> None:
    added = invoke(
        "add", "weekly", "tasks.w", "--rrule", RULE, "--tz", "Europe/Rome",
        "--max-retries", "2", "--retry-base", "30", "--catch-up-cap", "5",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    record = store.routines.by_name("weekly")
    assert record is not None and record.rrule == RULE
    assert (record.max_retries, record.retry_base_seconds, record.catch_up_cap) == (2, 30, 5)
    edited = invoke("edit", "weekly", "--solar", "sunrise 45.46 9.19")
    assert edited.exit_code == 0, edited.output
    record = store.routines.by_name("weekly")
    assert record is not None and (record.solar, record.rrule) == ("sunrise 45.46 9.19", None)
    both = invoke("edit", "weekly", "--rrule", RULE, "--solar", "sunset 1 2")
    assert both.exit_code != 0 and "give one schedule, not rrule and solar" in both.output
    bad = invoke("add", "bad", "tasks.b", "--rrule", "every monday")
    assert bad.exit_code != 0 and "'every monday'" in bad.output
    assert store.routines.by_name("bad") is None
