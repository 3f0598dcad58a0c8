"""``celery routines preview``: a stored routine by name (the windows beat
fires for it), and every schedule form ``add`` takes, on one line as
``list`` prints it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from celery_routines.operator.cli import routines
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.operators import Invoke, add_routine, cli_invoker, make_app, ok, one_error


@pytest.fixture
def invoke(
    store: Store,
    database_url: str,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> Invoke:
    return cli_invoker(make_app(tmp_path / "broker", database_url), clock, monkeypatch)


def utcs(text: str) -> list[str]:
    found = json.loads(text)
    return [w["utc"] for w in (found["windows"] if isinstance(found, dict) else found)]


def test_preview_takes_a_stored_routines_name_and_previews_its_own_windows(
    invoke: Invoke, store: Store
) -> None:
    # The new user's routine: paused (imported paused), in Rome, with a calendar.
    add_routine(
        store,
        "nightly-rome",
        cron="0 9 25 * *",
        timezone="Europe/Rome",
        exclude='["holidays:IT"]',
        shift="previous_business_day",
        paused=True,
    )
    text = ok(invoke("preview", "nightly-rome", "--from", "2026-04-01", "-n", "3"))
    assert text.splitlines()[0] == (
        "nightly-rome: 0 9 25 * * except holidays:IT, previous_business_day in Europe/Rome; "
        "paused: none of them fires now (UTC, then Europe/Rome):"
    )
    assert "2026-04-24 09:00:00 CEST  (moved from Sat 2026-04-25, Liberation Day)" in text
    found = json.loads(ok(invoke("preview", "nightly-rome", "-n", "2", "--json")))
    # From now (the clock: 2026-11-30 12:00 UTC), as beat would adopt it;
    # 2026-12-25 is Christmas, a Friday: moved back to Thursday the 24th.
    assert [w["local"] for w in found["windows"]] == [
        "2026-12-24T09:00:00+01:00",
        "2027-01-25T09:00:00+01:00",
    ]
    assert found["windows"][0]["idempotency_key"] == "nightly-rome@2026-12-24T09:00:00+01:00"
    # Its own zone and calendar: another one given is refused, not mixed in.
    assert one_error(invoke("preview", "nightly-rome", "--tz", "UTC")) == (
        "Error: routine 'nightly-rome' is previewed with its own zone and calendar: drop --tz"
    )


def test_preview_of_an_interval_routine_stays_on_its_grid(invoke: Invoke, store: Store) -> None:
    anchor = datetime(2026, 11, 30, 12, 0, 7, tzinfo=UTC)
    add_routine(store, "poll", cron=None, interval_seconds=20.0, next_run_at=anchor)
    later = ok(invoke("preview", "poll", "-n", "2", "--json", "--from", "2026-11-30T12:01Z"))
    assert utcs(later) == ["2026-11-30T12:01:07+00:00", "2026-11-30T12:01:27+00:00"]
    found = json.loads(ok(invoke("preview", "poll", "-n", "2", "--json")))
    assert [w["utc"] for w in found["windows"]] == [
        "2026-11-30T12:00:07+00:00",
        "2026-11-30T12:00:27+00:00",
    ]


def test_an_argument_that_is_neither_a_routine_nor_a_schedule_is_one_line(
    invoke: Invoke, store: Store
) -> None:
    line = one_error(invoke("preview", "nightly-rome"))
    assert line.startswith("Error: 'nightly-rome' is neither a stored routine nor a schedule (")
    assert "'every 20s'" in line
    assert line.endswith(
        "cron expression 'nightly-rome' is invalid: it has 1 fields, "
        "expected 5 fields: minute hour day-of-month month day-of-week"
    )
    assert "is neither a stored routine" in one_error(invoke("preview", "every 0s"))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("every 20s", ["2026-11-30T12:00:20+00:00", "2026-11-30T12:00:40+00:00"]),
        ("every 1h30m", ["2026-11-30T13:30:00+00:00", "2026-11-30T15:00:00+00:00"]),
        # An interval in a union is a grid on the epoch (as `add --cron A --cron B`).
        ("*/2 * * * * + every 90s", ["2026-11-30T12:00:00+00:00", "2026-11-30T12:01:30+00:00"]),
        ("at 2026-12-24T18:00:30", ["2026-12-24T18:00:30+00:00"]),
        ("once at 2026-12-24T17:00:00+00:00", ["2026-12-24T17:00:00+00:00"]),
        ("@daily", ["2026-12-01T00:00:00+00:00", "2026-12-02T00:00:00+00:00"]),
        (
            "rrule DTSTART:20260105T090000 RRULE:FREQ=WEEKLY;BYDAY=MO",
            ["2026-12-07T09:00:00+00:00", "2026-12-14T09:00:00+00:00"],
        ),
        ("DTSTART:20261201T090000\nRRULE:FREQ=DAILY;COUNT=1", ["2026-12-01T09:00:00+00:00"]),
        (
            "0 9 * * * + DTSTART:20261201T100000 RRULE:FREQ=DAILY",
            ["2026-12-01T09:00:00+00:00", "2026-12-01T10:00:00+00:00"],
        ),
        ("sunrise 45.46 9.19", ["2026-12-01T06:42:34+00:00", "2026-12-02T06:43:43+00:00"]),
        ("0 9 * * * + every 0s", None),
    ],
)
def test_preview_takes_every_schedule_form_add_takes(
    spec: str, expected: list[str] | None, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """No database, no app: a schedule needs neither."""
    monkeypatch.setattr("celery_routines.operator.commands.CLOCK", clock)
    result = CliRunner().invoke(routines, ["preview", spec, "-n", "2", "--json"])
    if expected is None:
        assert "is not a schedule" in one_error(result)
        return
    assert utcs(ok(result)) == expected


def test_a_schedule_previews_as_add_stores_it() -> None:
    runner = CliRunner()
    # add's own messages, naming the value.
    assert one_error(runner.invoke(routines, ["preview", "every 5 parsecs"])).endswith(
        "--every must be a duration such as 30s, 5m, 1h30m, 7d or 2w, got '5 parsecs'"
    )
    assert "shift" in one_error(
        runner.invoke(routines, ["preview", "every 1h", "--shift", "next_business_day"])
    )
