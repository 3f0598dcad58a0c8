"""A run sent but never claimed by a worker (its message lost by a broker
restart, or its delivery given up) holds its routine behind
``overlap="skip"`` for ``routines_start_timeout``, not ``routines_run_timeout``;
and a message that merely waited in a long queue still runs its window once.

Beat with an injected clock on every database; the worker's claim is the
store call the worker makes (``claim_start``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from celery_routines import Scheduler, register
from celery_routines.store import RunRecord
from tests.conftest import FakeClock
from tests.harness import filesystem_app
from tests.tick.test_sweeps import runs

START_TIMEOUT = 120
RUN_TIMEOUT = 3600


def beat(folder: Path, database_url: str, clock: FakeClock) -> Scheduler:
    app = filesystem_app(
        folder,
        database_url,
        routines_start_timeout=START_TIMEOUT,
        routines_run_timeout=RUN_TIMEOUT,
    )
    return Scheduler(app, clock=clock)


@contextmanager
def hourly_report_sent(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> Iterator[tuple[Scheduler, RunRecord]]:
    """An hourly routine with two retries, adopted and its first window sent."""
    register("tasks.report", timedelta(hours=1), name="report", max_retries=2)
    scheduler = beat(tmp_path / "broker", database_url, clock)
    try:
        scheduler.tick()
        clock.advance(hours=1)
        scheduler.tick()
        [run] = runs(scheduler.store, "report")
        yield scheduler, run
    finally:
        scheduler.close()


def test_a_run_whose_message_was_lost_frees_its_routine_after_the_start_timeout(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register("tasks.poll", timedelta(minutes=1), name="poll", max_retries=0)
    scheduler = beat(tmp_path / "broker", database_url, clock)
    store = scheduler.store
    try:
        scheduler.tick()  # adopts: first window a minute on
        clock.advance(minutes=1)
        scheduler.tick()
        [first] = runs(store, "poll")
        assert first.state == "sent"
        assert first.deadline_at == clock.now + timedelta(seconds=START_TIMEOUT)
        # Its message is lost: no worker ever claims it. While it is open,
        # the next window is an overlap skip ...
        clock.advance(minutes=1)
        scheduler.tick()
        assert [r.state for r in runs(store, "poll")] == ["sent", "skipped"]
        # ... until the start timeout, not the hour of the run timeout.
        clock.advance(minutes=1, seconds=1)
        scheduler.tick()
        clock.advance(seconds=59)
        scheduler.tick()
        states = [(r.state, r.reason) for r in runs(store, "poll")]
        assert states[0] == ("lost", "lost")
        assert "not started by" in (runs(store, "poll")[0].error or "")
        assert ("sent", None) in states[1:], states  # the routine fires again
    finally:
        scheduler.close()


def test_a_late_message_runs_its_window_once_and_its_retry_never_goes_out(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    with hourly_report_sent(database_url, tmp_path, clock) as (scheduler, run):
        store = scheduler.store
        # The queue is long: nobody claims it within the start timeout.
        clock.advance(seconds=START_TIMEOUT + 1)
        scheduler.tick()
        lost = store.runs.get(run.id)
        assert (lost.state, lost.reason) == ("retrying", "lost")
        # The message reaches a worker before the retry goes out: it runs.
        assert store.outcomes.claim_start(run.id, "worker-1", clock.now)
        claimed = store.runs.get(run.id)
        assert (claimed.state, claimed.reason, claimed.error) == ("running", None, None)
        # The retry, conditional on the row still waiting for it, never goes out.
        clock.advance(hours=1)
        scheduler.tick()
        assert [(r.attempt, r.state) for r in runs(store, "report")][:1] == [(1, "running")]
        assert all(
            r.attempt == 1 for r in runs(store, "report") if r.scheduled_for == run.scheduled_for
        )


def test_a_message_later_than_its_retry_is_refused_and_the_window_runs_once(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    with hourly_report_sent(database_url, tmp_path, clock) as (scheduler, first):
        store = scheduler.store
        clock.advance(seconds=START_TIMEOUT + 1)
        scheduler.tick()  # declared lost
        clock.advance(minutes=5)
        scheduler.tick()  # its retry goes out as attempt 2
        attempts = {r.attempt: r for r in runs(store, "report")}
        assert attempts[1].state == "lost" and attempts[2].state == "sent"
        # The first message arrives now: refused; attempt 2 runs.
        assert not store.outcomes.claim_start(first.id, "worker-1", clock.now)
        assert store.outcomes.claim_start(attempts[2].id, "worker-2", clock.now)
        assert store.runs.get(first.id).state == "lost"


def test_a_run_that_started_is_not_taken_again_after_it_was_declared_lost(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    # A claimed run declared lost (its worker died under the body) may have
    # run: a late duplicate must not run it again; only its retry does.
    with hourly_report_sent(database_url, tmp_path, clock) as (scheduler, run):
        store = scheduler.store
        assert store.outcomes.claim_start(
            run.id, "worker-1", clock.now, deadline_at=clock.now + timedelta(seconds=60)
        )
        clock.advance(seconds=61)
        scheduler.tick()
        assert (store.runs.get(run.id).state, store.runs.get(run.id).reason) == (
            "retrying",
            "lost",
        )
        assert not store.outcomes.claim_start(run.id, "worker-2", clock.now, celery_retries=0)
