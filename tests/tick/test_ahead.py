"""A burst's next batch claimed and written while this one is published
(tick/ahead.py, PostgreSQL): every window still goes out once, the next
claim never takes back the batch being published, and a prepared batch that
is never published is sent by whoever holds its routines next."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from celery_routines import Scheduler, register
from celery_routines.tick.send import STOP_GRACE_SECONDS
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published, runs_of

ROUTINES = 250
BATCH = 100
AHEAD_THREAD = "celery-routines-next-batch"


def make(folder: Path, database_url: str, clock: FakeClock, **conf: Any) -> Scheduler:
    conf.setdefault("routines_batch_size", BATCH)
    scheduler = Scheduler(filesystem_app(folder, database_url, **conf), clock=clock)
    if scheduler.engine.ahead is None:
        scheduler.close()
        pytest.skip("the next batch is written while this one publishes on PostgreSQL only")
    return scheduler


def declare() -> None:
    for n in range(ROUTINES):
        register("tasks.poll", timedelta(minutes=1), name=f"poll-{n:04d}")


def adopt_all(scheduler: Scheduler, clock: FakeClock) -> None:
    """Adopted a batch per tick, at one instant: one grid, due together in a minute."""
    for _ in range(ROUTINES // BATCH + 1):
        scheduler.tick()
    clock.advance(minutes=1)


def spy_claims(scheduler: Scheduler) -> list[tuple[str, set[int]]]:
    """Every claim: the thread it ran on and the routines it returned."""
    routines = scheduler.store.routines
    claim_due = routines.claim_due
    claims: list[tuple[str, set[int]]] = []

    def spied(*args: Any, **kwargs: Any) -> Any:
        claimed = claim_due(*args, **kwargs)
        claims.append((threading.current_thread().name, {r.id for r in claimed}))
        return claimed

    routines.claim_due = spied  # type: ignore[method-assign]
    return claims


def assert_each_window_sent_once(scheduler: Scheduler, folder: Path) -> None:
    counts = Counter(m["id"] for m in published(folder))
    assert len(counts) == ROUTINES and set(counts.values()) == {1}, counts.most_common(3)
    states = Counter(
        run["state"] for n in range(ROUTINES) for run in runs_of(scheduler.store, f"poll-{n:04d}")
    )
    assert states == {"sent": ROUTINES}
    assert not scheduler.engine.ledger


def test_a_burst_writes_its_next_batch_while_publishing_and_never_reclaims_the_one_going_out(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    declare()
    folder = tmp_path / "broker"
    scheduler = make(folder, database_url, clock)
    try:
        adopt_all(scheduler, clock)
        claims = spy_claims(scheduler)
        conflicts = 0
        for _ in range(6):
            scheduler.tick()
            assert scheduler.last_report is not None
            conflicts += scheduler.last_report.conflicts
        assert [thread for thread, _ in claims[:3]] == ["MainThread", AHEAD_THREAD, AHEAD_THREAD]
        for (_, going_out), (thread, next_batch) in itertools.pairwise(claims):
            if thread == AHEAD_THREAD:
                assert not going_out & next_batch, "the next batch took back one being published"
        assert conflicts == 0
        assert_each_window_sent_once(scheduler, folder)
        for n in (0, ROUTINES - 1):
            record = scheduler.store.routines.by_name(f"poll-{n:04d}")
            assert record.locked_by is None
            assert record.next_run_at == clock.now.replace(second=0) + timedelta(minutes=1)
    finally:
        scheduler.close()


def test_a_tick_that_fails_after_the_next_batch_was_written_leaves_it_to_the_next_tick(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    declare()
    folder = tmp_path / "broker"
    scheduler = make(folder, database_url, clock)
    try:
        adopt_all(scheduler, clock)
        bookkeeping = scheduler.store.bookkeeping
        record_published = bookkeeping.record_published
        calls: list[int] = []

        def failing_once(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) == 1:  # the first batch's, while the second is written
                raise OperationalError("injected", {}, Exception("connection dropped"))
            return record_published(*args, **kwargs)

        bookkeeping.record_published = failing_once  # type: ignore[method-assign]
        scheduler.tick()  # fails after publishing: the beat logs it and ticks again
        assert calls == [1]
        assert len(published(folder)) == BATCH
        assert scheduler.engine.ahead._thread is not None  # the second batch, written
        for _ in range(6):
            clock.advance(seconds=1)
            scheduler.tick()
        assert_each_window_sent_once(scheduler, folder)
    finally:
        scheduler.close()


@pytest.mark.parametrize("out_of_grace", [False, True])
def test_a_beat_stopping_publishes_the_batch_it_wrote_within_its_grace_else_leaves_it_pending(
    tmp_path: Path, database_url: str, clock: FakeClock, out_of_grace: bool
) -> None:
    declare()
    folder = tmp_path / "broker"
    first = make(folder, database_url, clock)
    adopt_all(first, clock)
    first.tick()  # publishes the first batch; the second is written meanwhile
    if out_of_grace:  # told to stop (SIGTERM) longer ago than the grace
        first.engine.stopping = time.monotonic() - STOP_GRACE_SECONDS
    first.close()  # waits for the second batch, sends it (or not), hands the claims back
    out = BATCH if out_of_grace else 2 * BATCH
    assert len(published(folder)) == out
    states = Counter(
        run["state"] for n in range(ROUTINES) for run in runs_of(first.store, f"poll-{n:04d}")
    )
    assert states == ({"sent": BATCH, "pending": BATCH} if out_of_grace else {"sent": out})
    second = make(folder, database_url, clock)
    try:
        for _ in range(6):
            clock.advance(seconds=1)
            second.tick()
        assert_each_window_sent_once(second, folder)
    finally:
        second.close()
