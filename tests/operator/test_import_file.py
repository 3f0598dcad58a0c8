"""``celery routines export`` and ``celery routines import file PATH``: the
round trip changes nothing; upsert by name; ``--prune`` retires what the
file lacks; on every store."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, select

from celery_routines.config import Settings
from celery_routines.operator.admin import Routines
from celery_routines.store.models import ROUTINES
from tests.conftest import FakeClock
from tests.harness import recorded_changes
from tests.operators import add_routine, cli_invoker, make_app, ok, one_error


@pytest.fixture
def admin(store, database_url: str, clock: FakeClock) -> Iterator[Routines]:
    with Routines(Settings(database_url=database_url), clock=clock, store=store) as admin:
        yield admin


@pytest.fixture
def invoke(store, database_url: str, tmp_path: Path, clock: FakeClock, monkeypatch):
    return cli_invoker(make_app(tmp_path / "broker", database_url), clock, monkeypatch)


def every_kind(admin: Routines) -> None:
    admin.add(
        "poll",
        "tasks.poll",
        every="5m",
        options={"queue": "slow"},
        args=[1, "a"],
        kwargs={"x": {"y": 2}},
        ceilings=["100/day", "3 eur/month"],
        max_lateness="10m",
        overlap="queue",
        catch_up="latest",
    )
    admin.add(
        "nightly",
        "tasks.report",
        cron="30 2 * * *",
        timezone="Europe/Rome",
        starts_at="2026-12-01T00:00",
        ends_at="2027-06-30T00:00",
        jitter=30,
    )
    admin.add("christmas", "tasks.greet", at="2026-12-24T18:00", timezone="Europe/Rome")
    admin.edit("poll", by="ana")
    add_routine(admin.store, "sunrise", cron=None, solar="sunrise 41.9 12.5", source="cli")
    add_routine(
        admin.store,
        "mondays",
        cron=None,
        timezone="Europe/Rome",
        source="cli",
        rrule="DTSTART:20261102T090000\nRRULE:FREQ=WEEKLY;COUNT=3;BYDAY=MO",
    )
    # The calendar, pause and notification options (issues 31, 34) travel too.
    admin.add(
        "payroll",
        "tasks.pay",
        cron=["0 9 27 * *", "0 9 L * *"],
        timezone="Europe/Rome",
        exclude=["2026-12-25", "holidays:IT", "0 * * 8 *"],
        shift="previous_business_day",
        pause_after_failures=3,
        notify_url="https://hooks.example.com/payroll",
    )
    add_routine(admin.store, "from-code", cron="0 * * * *", source="code", owner="proj")
    add_routine(admin.store, "by-sql", interval_seconds=90.5, enabled=False)


def snapshot(admin: Routines) -> list[dict[str, Any]]:
    table = ROUTINES
    with admin.store.engine.connect() as conn:
        rows = conn.execute(select(table).order_by(table.c.name))
        return [dict(row._mapping) for row in rows]


def test_the_round_trip_changes_nothing(invoke, admin: Routines, tmp_path: Path) -> None:
    every_kind(admin)
    before, changes = snapshot(admin), recorded_changes(admin.store)
    exported = ok(invoke("export"))
    data = json.loads(exported)
    assert data["routines"]["poll"] == {
        "task": "tasks.poll",
        "every": 300.0,
        "args": [1, "a"],
        "kwargs": {"x": {"y": 2}},
        "options": {"queue": "slow"},
        "catch_up": "latest",
        "max_lateness": 600.0,
        "overlap": "queue",
        "ceiling": [
            {"limit": 100.0, "per": "day", "unit": "fires"},
            {"limit": 3.0, "per": "month", "unit": "eur"},
        ],
    }
    assert data["routines"]["nightly"]["starts_at"] == "2026-11-30T23:00:00+00:00"
    payroll = data["routines"]["payroll"]
    assert {k: payroll[k] for k in payroll if k not in ("task", "timezone")} == {
        "schedule": ["0 9 27 * *", "0 9 L * *"],
        "exclude": ["2026-12-25", "holidays:IT", "0 * * 8 *"],
        "shift": "previous_business_day",
        "pause_after_failures": 3,
        "notify_url": "https://hooks.example.com/payroll",
    }
    path = tmp_path / "routines.json"
    path.write_text(exported)
    out = ok(invoke("import", "file", str(path)))
    assert out.splitlines()[-1] == "file: 0 added, 8 unchanged, 0 not imported"
    assert snapshot(admin) == before
    assert recorded_changes(admin.store) == changes
    # The same through YAML.
    yaml_path = tmp_path / "routines.yaml"
    yaml_path.write_text(ok(invoke("export", "--format", "yaml")))
    out = ok(invoke("import", "file", str(yaml_path)))
    assert out.splitlines()[-1] == "file: 0 added, 8 unchanged, 0 not imported"
    assert snapshot(admin) == before


def test_upsert_by_name_and_prune_retires_what_the_file_lacks(
    invoke, admin: Routines, tmp_path: Path
) -> None:
    every_kind(admin)
    data = json.loads(ok(invoke("export")))
    entries = data["routines"]
    entries["nightly"]["cron"] = "45 2 * * *"
    del entries["poll"], entries["by-sql"], entries["from-code"]
    entries["new-one"] = {"task": "tasks.new", "cron": "0 8 * * 1-5", "timezone": "Europe/Rome"}
    path = tmp_path / "routines.json"
    path.write_text(json.dumps(data))
    out = ok(invoke("import", "file", str(path), "--prune"))
    lines = out.splitlines()
    assert "added         new-one  next window: the first after beat adopts it" in lines
    assert any(line.startswith("updated       nightly") for line in lines)
    assert "retired       poll: not in the file" in lines
    assert "retired       by-sql: not in the file" in lines
    assert lines[-1] == "file: 1 added, 1 updated, 4 unchanged, 2 retired, 0 not imported"
    states = {s.name: s.state for s in admin.list()}
    assert states["poll"] == "retired" and states["by-sql"] == "retired"
    assert states["from-code"] == "enabled"  # code routines are retired by their own app
    assert admin.store.routines.by_name("nightly").cron == "45 2 * * *"
    assert admin.store.routines.by_name("new-one").owner == "import:file"
    # Back in the file: back in service, with a new first window.
    entries["poll"] = {"task": "tasks.poll", "every": 300}
    path.write_text(json.dumps(data))
    out = ok(invoke("import", "file", str(path)))
    assert any(line.startswith("updated       poll") for line in out.splitlines())
    assert admin.store.routines.by_name("poll").retired_at is None


def test_a_code_routine_is_changed_in_the_code(invoke, admin: Routines, tmp_path: Path) -> None:
    add_routine(admin.store, "from-code", cron="0 * * * *", source="code", owner="proj")
    path = tmp_path / "routines.json"
    path.write_text(
        json.dumps({"routines": {"from-code": {"task": "tasks.noop", "cron": "5 * * * *"}}})
    )
    result = invoke("import", "file", str(path))
    assert result.exit_code == 1
    assert (
        "not imported  from-code: declared in the code of app 'proj': change it there"
        in result.stdout
    )
    assert admin.store.routines.by_name("from-code").cron == "0 * * * *"


def test_bad_entries_are_listed_and_bad_files_are_one_line(
    invoke, admin: Routines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "routines.json"
    path.write_text(
        json.dumps(
            {
                "routines": {
                    "good": {"task": "tasks.ok", "every": 60},
                    "typo": {"task": "tasks.ok", "every": 60, "catchup": "latest"},
                    "bad-cron": {"task": "tasks.ok", "cron": "61 * * * *"},
                    "two": {"task": "tasks.ok", "every": 60, "cron": "* * * * *"},
                    "numbered": {"task": 5, "every": 60},
                    "union": {"task": "tasks.ok", "schedule": "0 9 * * *"},
                    "closed": {"task": "tasks.ok", "every": 60, "exclude": "2026-12-25"},
                    "hook": {"task": "tasks.ok", "every": 60, "notify_url": "hooks.example"},
                }
            }
        )
    )
    result = invoke("import", "file", str(path))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert any(line.startswith("not imported  typo: unknown key(s) catchup") for line in lines)
    assert any(line.startswith("not imported  bad-cron: ") and "61" in line for line in lines)
    assert "not imported  two: give one schedule, got cron, every" in lines
    assert "not imported  numbered: its task must be a task name, got 5" in lines
    assert (
        "not imported  union: schedule must be a list of crons, rrules and intervals, "
        "got '0 9 * * *'" in lines
    )
    assert "not imported  closed: exclude must be a list, got '2026-12-25'" in lines
    assert any(
        line.startswith("not imported  hook: ") and "hooks.example" in line for line in lines
    )
    assert [s.name for s in admin.list()] == ["good"]
    (tmp_path / "broken.json").write_text("{nope")
    assert "broken.json does not parse: Expecting property name" in one_error(
        invoke("import", "file", str(tmp_path / "broken.json"))
    )
    (tmp_path / "list.json").write_text("[]")
    assert "is not a routines file" in one_error(
        invoke("import", "file", str(tmp_path / "list.json"))
    )
    assert "cannot read" in one_error(invoke("import", "file", str(tmp_path / "missing.json")))


YAML_MISSING = (
    "Error: YAML (export --format yaml, import file *.yaml) needs the 'yaml' extra (yaml is not "
    "installed): pip install 'celery-routines[yaml]' (from a checkout: pip install "
    "'./celery-routines[yaml]')"
)


def test_yaml_without_pyyaml_is_one_line_naming_the_extra_and_writes_no_file(
    invoke, admin: Routines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin.add("poll", "tasks.poll", every="5m")
    yaml_path = tmp_path / "routines.yaml"
    yaml_path.write_text(ok(invoke("export", "--format", "yaml")))
    monkeypatch.setitem(sys.modules, "yaml", None)  # PyYAML hidden: `import yaml` fails
    target = tmp_path / "out.yaml"
    assert one_error(invoke("export", "--format", "yaml", "--output", str(target))) == YAML_MISSING
    assert not target.exists()
    assert list(tmp_path.glob(".out.yaml.*")) == []  # no partial file left either
    assert one_error(invoke("export", "--format", "yaml")) == YAML_MISSING
    assert one_error(invoke("import", "file", str(yaml_path))) == YAML_MISSING
    # JSON needs nothing: written whole, and an older file is replaced only then.
    target.write_text("old")
    assert ok(invoke("export", "--output", str(target))) == ""
    assert json.loads(target.read_text())["routines"]["poll"]["every"] == 300.0
    assert "cannot write" in one_error(
        invoke("export", "--output", str(tmp_path / "missing" / "out.json"))
    )


def test_dry_run_writes_nothing(invoke, admin: Routines, tmp_path: Path) -> None:
    path = tmp_path / "routines.json"
    path.write_text(json.dumps({"routines": {"good": {"task": "tasks.ok", "every": 60}}}))
    out = ok(invoke("import", "file", str(path), "--dry-run"))
    assert out.splitlines()[-1] == "file: 1 added, 0 not imported (dry run: nothing written)"
    assert admin.list() == []


def test_a_dry_run_on_a_store_with_no_tables_plans_and_creates_nothing(
    database_url: str, tmp_path: Path, clock: FakeClock, monkeypatch
) -> None:
    """The real import would create the schema: its dry run plans against an
    empty store instead of asking for `migrate`, and leaves no table (on
    SQLite, no file) behind."""
    path = tmp_path / "routines.json"
    path.write_text(json.dumps({"routines": {"good": {"task": "tasks.ok", "every": 60}}}))
    invoke = cli_invoker(make_app(tmp_path / "broker", database_url), clock, monkeypatch)
    out = ok(invoke("import", "file", str(path), "--dry-run", "--prune"))
    lines = out.splitlines()
    assert lines[0].startswith("added         good")
    assert lines[-2].startswith("the store has no tables yet: this plan is against an empty")
    assert lines[-1] == "file: 1 added, 0 not imported (dry run: nothing written)"
    if database_url.startswith("sqlite"):
        assert not (tmp_path / "routines.db").exists()
    else:
        engine = create_engine(database_url)
        try:
            assert inspect(engine).get_table_names() == []
        finally:
            engine.dispose()
    as_json = json.loads(ok(invoke("import", "file", str(path), "--dry-run", "--json")))
    assert as_json["dry_run"] is True and as_json["lines"][0]["action"] == "added"
    ok(invoke("import", "file", str(path)))  # the real run creates the tables
    assert "no tables" not in ok(invoke("import", "file", str(path), "--dry-run"))


def test_prune_never_retires_a_routine_whose_entry_does_not_read(
    invoke, admin: Routines, tmp_path: Path
) -> None:
    """A typo in one entry is that entry listed, not its routine retired:
    the entry is still in the file, only unreadable."""
    path = tmp_path / "routines.json"
    path.write_text(json.dumps({"routines": {"poll": {"task": "tasks.poll", "every": 300}}}))
    ok(invoke("import", "file", str(path)))
    path.write_text(
        json.dumps({"routines": {"poll": {"task": "tasks.poll", "every": 300, "ovrelap": "x"}}})
    )
    result = invoke("import", "file", str(path), "--prune")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert any(line.startswith("not imported  poll: unknown key(s) ovrelap") for line in lines)
    assert lines[-1] == "file: 0 added, 1 not imported"
    record = admin.store.routines.by_name("poll")
    assert record.retired_at is None and record.interval_seconds == 300


def test_an_import_shows_and_records_values_as_show_does(
    invoke, admin: Routines, tmp_path: Path
) -> None:
    """An import's answer and its history mask a notify_url's secret and give
    exclusions as a list, as add/edit and show do (they printed the URL whole)."""
    secret = "https://hooks.example.com/services/T1/s3cret"
    entry = {"task": "tasks.pay", "cron": "0 9 * * *", "notify_url": secret}
    path = tmp_path / "routines.json"
    path.write_text(json.dumps({"version": 1, "routines": {"pay": entry}}))
    out = ok(invoke("import", "file", str(path), "--json"))
    assert "s3cret" not in out and "https://hooks.example.com/services/***" in out
    entry["exclude"] = ["2026-12-25"]
    path.write_text(json.dumps({"version": 1, "routines": {"pay": entry}}))
    answer = json.loads(ok(invoke("import", "file", str(path), "--json")))
    assert "'exclude': ['2026-12-25']" in str(answer)
    history = admin.history("pay")
    assert [c.action for c in history] == ["reimported", "imported"]
    assert "s3cret" not in str([c.detail for c in history])
    assert admin.store.routines.by_name("pay").notify_url == secret
