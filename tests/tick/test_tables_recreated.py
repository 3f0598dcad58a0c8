"""A store whose tables are dropped (the database recreated empty) under a
running beat: each failed tick is one line, and beat creates the tables and
declares the code's routines again, as at start, instead of ticking on an
empty store; on every store."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from celery_routines import Scheduler, redeclare, register
from celery_routines.store.engine import safe_url
from tests.conftest import FakeClock
from tests.harness import drop_every_table, filesystem_app, published


@pytest.fixture
def beat(database_url: str, migrated_schema: None, tmp_path: Path, clock: FakeClock):
    register("tasks.poll", "*/5 * * * *", name="poll", overlap="overlap")
    scheduler = Scheduler(filesystem_app(tmp_path / "broker", database_url), clock=clock)
    scheduler.tick()
    yield scheduler
    scheduler.close()


def test_dropped_tables_fail_one_line_per_tick_then_beat_declares_its_routines_again(
    beat: Scheduler,
    database_url: str,
    tmp_path: Path,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    drop_every_table(database_url)
    with caplog.at_level(logging.DEBUG, logger="celery_routines.beat"):
        beat.tick()
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    message = error.getMessage()
    assert message.startswith("beat tick failed: the store's tables are missing (")
    assert "routines" in message and "SELECT" not in message and "\n" not in message
    assert error.exc_info is None
    assert any(r.levelno == logging.DEBUG and r.exc_info for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        beat.tick()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("celery-routines: the tables of ")
    assert "had been dropped: created them again and declared the 2 routine(s)" in warnings[0]
    assert {r.name for r in beat.store.routines.all()} == {"poll", "celery.backend_cleanup"}
    clock.advance(minutes=5)
    beat.tick()
    windows = [m["routine_window"] for m in published(tmp_path / "broker")]
    assert "poll@2026-11-30T12:05:00+00:00" in windows


def test_tables_recreated_between_two_ticks_are_found_by_the_periodic_check(
    beat: Scheduler,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No tick failed (dropped, recreated and migrated while beat slept):
    the check every CHECK_EVERY seconds finds the code's routines missing."""
    drop_every_table(database_url, migrate=True)
    monkeypatch.setattr(redeclare, "CHECK_EVERY", 0.0)
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        beat.tick()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "celery-routines: 2 routine(s) declared in code were missing from "
        f"{safe_url(database_url)} "
        "(celery.backend_cleanup, poll): declared them again, as at beat start"
    ]
    assert {r.name for r in beat.store.routines.all()} == {"poll", "celery.backend_cleanup"}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        beat.tick()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_readiness_probe_makes_the_next_tick_check(
    beat: Scheduler, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Long before CHECK_EVERY: a /readyz asks beat to check at its next tick."""
    drop_every_table(database_url, migrate=True)
    beat.tick()
    assert beat.store.routines.all() == []  # nothing checked yet: no probe, no minute
    assert beat.health is not None
    beat.health.answer("/readyz")
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        beat.tick()
    assert "2 routine(s) declared in code were missing" in caplog.text
    assert {r.name for r in beat.store.routines.all()} == {"poll", "celery.backend_cleanup"}
