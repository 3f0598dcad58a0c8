"""examples/real_world.py declares what its docstring promises, and beat plus
the operator command handle it (SQLite, filesystem broker, injected clock)."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

from celery_routines import Scheduler, registry
from celery_routines.operator.admin import Routines
from tests.conftest import FakeClock
from tests.e2e.processes import REPO
from tests.harness import published


def load_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("REAL_WORLD_BROKER_FOLDER", str(tmp_path / "broker"))
    monkeypatch.setenv("ROUTINES_DATABASE_URL", f"sqlite:///{tmp_path / 'routines.db'}")
    (tmp_path / "broker").mkdir()
    spec = importlib.util.spec_from_file_location(
        "real_world_example", REPO / "examples" / "real_world.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_real_world_example_declares_its_three_policies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_example(tmp_path, monkeypatch)
    declared = {d.name: d for d in registry.declared()}
    report, reminder, poll = declared["daily-report"], declared["reminder"], declared["poll-inbox"]
    assert (report.cron, report.timezone, report.catch_up, report.catch_up_cap) == (
        "30 2 * * *",
        "Europe/Rome",
        "catch_up",
        7,
    )
    assert [(c.limit, c.per, c.unit) for c in report.ceilings] == [(50, "month", "eur")]
    assert (reminder.catch_up, reminder.max_lateness) == ("skip_to_next", 600.0)
    assert (poll.interval_seconds, poll.overlap) == (120.0, "skip")


def test_beat_fires_it_and_the_operator_api_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_example(tmp_path, monkeypatch)
    clock = FakeClock(datetime(2026, 11, 30, 1, 0, tzinfo=UTC))
    scheduler = Scheduler(module.app, clock=clock)
    try:
        scheduler.tick()  # writes and adopts the three routines
        clock.advance(minutes=30)  # 02:30 in Rome: the report is due
        scheduler.tick()
        assert "daily-report" in {m["routine"] for m in published(tmp_path / "broker")}
    finally:
        scheduler.close()
    with Routines(module.app, clock=clock) as routines:
        states = {s.name: s.state for s in routines.list()}
        report = routines.show("daily-report")
    # (plus celery.backend_cleanup, which Celery's own beat would run too)
    assert {name: states[name] for name in ("daily-report", "poll-inbox", "reminder")} == {
        "daily-report": "enabled",
        "poll-inbox": "enabled",
        "reminder": "enabled",
    }
    [eur] = report.ceilings
    assert (eur.unit, eur.limit, eur.spent) == ("eur", 50, 0)
    assert report.next_windows[0].local.isoformat() == "2026-12-01T02:30:00+01:00"
