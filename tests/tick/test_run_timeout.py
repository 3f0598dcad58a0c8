"""A routine's own ``run_timeout`` (issue 18): its runs' lost deadlines are
written with it, the message carries it for the worker's heartbeat, and a
routine without one keeps ``routines_run_timeout``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from celery_routines import Scheduler
from celery_routines.sending.publish import RUN_TIMEOUT_HEADER
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.harness import filesystem_app, insert_routine, published, runs_for


def _deadline(store: Store, name: str) -> timedelta:
    record = store.routines.by_name(name)
    assert record is not None
    [run] = runs_for(store, record.id)
    assert run.state == "sent" and run.deadline_at is not None and run.sent_at is not None
    return run.deadline_at - run.sent_at


def test_a_routines_own_run_timeout_sets_its_deadline_and_its_message(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "broker"
    app = filesystem_app(folder, database_url, routines_run_timeout=3600)
    scheduler = Scheduler(app, clock=clock)
    try:
        due = clock().replace(tzinfo=None)
        insert_routine(scheduler.store, "own", cron="* * * * *", run_timeout=90.0, next_run_at=due)
        insert_routine(scheduler.store, "default", cron="* * * * *", next_run_at=due)
        scheduler.tick()
        own, default = _deadline(scheduler.store, "own"), _deadline(scheduler.store, "default")
        # Both written on the same (database) clock in one tick: only the
        # timeouts differ.
        assert default - own == timedelta(seconds=3600 - 90)
        headers = {m["routine"]: m for m in published(folder)}
        assert headers["own"][RUN_TIMEOUT_HEADER] == 90.0
        assert RUN_TIMEOUT_HEADER not in headers["default"]
    finally:
        scheduler.close()
