"""What beat's probes answer, on an injected monotonic clock (the real-beat
flips are in tests/faults/test_health_probes_real.py)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from celery_routines import Scheduler, register
from celery_routines.config import settings_from
from celery_routines.errors import ConfigurationError
from celery_routines.observe import health as health_module
from celery_routines.observe.health import BeatHealth
from tests.conftest import FakeClock
from tests.harness import drop_every_table, filesystem_app


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_livez_flips_after_three_loop_intervals_of_at_least_five_seconds() -> None:
    clock = Monotonic()
    for interval, limit in ((1, 15.0), (5, 15.0), (300, 900.0)):
        health = BeatHealth(interval, lambda: None, clock)
        assert health.answer("/livez")[0] == 200  # a starting beat counts from its start
        clock.now += limit
        assert health.answer("/livez")[0] == 200
        clock.now += 0.5
        status, body = health.answer("/livez")
        assert status == 503 and f"limit {limit:.0f} s" in body
        health.tick_finished(ok=False)  # a failed tick still turns the loop
        assert health.answer("/livez")[0] == 200


def test_readyz_needs_a_finished_tick_and_a_store_at_the_code_s_revision() -> None:
    clock = Monotonic()
    problem: list[str | None] = [None]
    health = BeatHealth(1, lambda: problem[0], clock)
    assert health.answer("/readyz") == (503, "this beat has not finished a tick yet")
    health.tick_finished(ok=False)
    assert health.answer("/readyz")[0] == 503
    health.tick_finished(ok=True)
    assert health.answer("/readyz?verbose=1") == (200, "ok")
    problem[0] = "schema is at 0005, this code needs 0006"
    assert health.answer("/readyz") == (200, "ok")  # the store's answer is reused for 1 s
    clock.now += 1.0
    assert health.answer("/readyz") == (503, "schema is at 0005, this code needs 0006")
    assert health.answer("/metrics") is None


def test_a_store_error_is_one_line_and_a_hung_store_does_not_hang_the_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Monotonic()

    def broken() -> str | None:
        raise OSError("connection refused\nis the server running?")

    health = BeatHealth(1, broken, clock)
    health.tick_finished(ok=True)
    assert health.answer("/readyz") == (503, "store unreachable: OSError: connection refused")

    release = threading.Event()
    monkeypatch.setattr(health_module, "STORE_ANSWER_SECONDS", 0.2)

    def hangs() -> str | None:
        release.wait(30)
        return None

    hung = BeatHealth(1, hangs, clock)
    hung.tick_finished(ok=True)
    try:
        assert hung.answer("/readyz") == (503, "store did not answer within 0.2 s")
        # A second probe waits on the same question instead of asking again.
        assert hung.answer("/readyz")[0] == 503
        assert sum(t.name == "routines-health-store" for t in threading.enumerate()) == 1
    finally:
        release.set()


@pytest.mark.parametrize("raw", ["70000", "-1", "http"])
def test_a_bad_health_port_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("ROUTINES_HEALTH_PORT", raw)
    with pytest.raises(ConfigurationError, match="routines_health_port"):
        settings_from(None)


def test_readyz_says_the_tables_are_missing_until_beat_has_declared_its_routines_again(
    database_url: str,
    migrated_schema: None,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database dropped and recreated under a running beat: not ready,
    in plain words, while the tables are missing, and still not ready once
    an operator has migrated (the code's routines are not stored yet);
    ready once beat has declared them again at its next tick."""
    monkeypatch.setattr(health_module, "STORE_ANSWER_REUSED", 0.0)
    register("tasks.poll", "*/5 * * * *", name="poll")
    beat = Scheduler(filesystem_app(tmp_path / "broker", database_url), clock=clock)
    try:
        beat.tick()
        assert beat.health is not None and beat.health.answer("/readyz") == (200, "ok")
        drop_every_table(database_url)
        missing = (
            503,
            "the store's tables are missing (the database was dropped or recreated empty?): "
            "beat creates them and declares the code's routines at its next tick; or run "
            "`celery -A <app> routines migrate` then `celery -A <app> routines sync`",
        )
        assert beat.health.answer("/readyz") == missing
        with caplog.at_level(logging.CRITICAL, logger="celery_routines.beat"):
            beat.tick()  # fails: no tables
        assert beat.health.answer("/readyz") == missing
        drop_every_table(database_url, migrate=True)  # the operator ran `migrate`
        assert beat.health.answer("/readyz") == (
            503,
            "the store's tables were dropped: beat creates them if they are still missing "
            "and declares the code's routines again at its next tick",
        )
        beat.tick()
        assert beat.health.answer("/readyz") == (200, "ok")
        assert {r.name for r in beat.store.routines.all()} == {"poll", "celery.backend_cleanup"}
    finally:
        beat.close()
