"""Beat's own decisions go out as routine-* events: skips, suspensions, lost runs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from celery_routines import Ceiling, Scheduler, register
from tests.conftest import FakeClock
from tests.harness import filesystem_app


class RecordingEvents:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def skipped(self, routine: str, **fields: Any) -> None:
        self.sent.append(("skipped", routine, fields))

    def suspended(self, routine: str, **fields: Any) -> None:
        self.sent.append(("suspended", routine, fields))

    def lost(self, routine: str, **fields: Any) -> None:
        self.sent.append(("lost", routine, fields))

    def close(self) -> None:
        pass


def scheduler_with_events(tmp_path: Path, database_url: str, clock: FakeClock, **conf):
    scheduler = Scheduler(filesystem_app(tmp_path / "broker", database_url, **conf), clock=clock)
    events = RecordingEvents()
    scheduler.engine.events = events
    scheduler.engine.sweeps.events = events
    scheduler.engine.writer.events = events
    scheduler.engine.sender.events = events
    return scheduler, events


def test_a_recovery_skip_and_a_suspension_are_sent_as_events(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    register("tasks.poll", "*/5 * * * *", name="poll", catch_up_cap=2, overlap="overlap")
    register("tasks.mail", timedelta(minutes=10), name="mail", ceiling=Ceiling(1, per="day"))
    scheduler, events = scheduler_with_events(tmp_path, database_url, clock)
    try:
        scheduler.tick()
        clock.advance(hours=1)
        scheduler.tick()
        kinds = {(kind, routine) for kind, routine, _ in events.sent}
        assert ("skipped", "poll") in kinds
        assert ("suspended", "mail") in kinds
        [poll_skip] = [f for k, r, f in events.sent if (k, r) == ("skipped", "poll")]
        assert (poll_skip["reason"], poll_skip["count"]) == ("catch_up_cap", 10)
        [suspension] = [f for k, r, f in events.sent if k == "suspended"]
        assert "ceiling 1 fires/day reached" in suspension["reason"]
    finally:
        scheduler.close()


def test_a_lost_run_is_sent_as_an_event(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    register("tasks.slow", timedelta(hours=1), name="slow")
    scheduler, events = scheduler_with_events(
        tmp_path, database_url, clock, routines_run_timeout=60
    )
    try:
        scheduler.tick()
        clock.advance(hours=1)
        scheduler.tick()  # sent; no worker ever reports
        clock.advance(minutes=2)
        scheduler.tick()
        [(_kind, routine, fields)] = [e for e in events.sent if e[0] == "lost"]
        assert routine == "slow" and fields["idempotency_key"].startswith("slow@")
    finally:
        scheduler.close()
