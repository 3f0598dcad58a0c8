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
from celery_routines.tick.write import STOP_GRACE_SECONDS
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


def test_a_batch_s_bookkeeping_is_written_by_the_next_preparation_before_its_claim(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    """Behind the publishing of batch k+1, batch k's runs are marked sent and
    its routines moved on by the preparation of batch k+2, before it claims:
    so that claim never sees batch k still due (a window decided twice)."""
    declare()
    folder = tmp_path / "broker"
    scheduler = make(folder, database_url, clock)
    try:
        adopt_all(scheduler, clock)
        steps: list[tuple[str, str]] = []
        routines, bookkeeping = scheduler.store.routines, scheduler.store.bookkeeping
        claim_due, record_published = routines.claim_due, bookkeeping.record_published

        def claiming(*args: Any, **kwargs: Any) -> Any:
            steps.append(("claim", threading.current_thread().name))
            return claim_due(*args, **kwargs)

        def recording(*args: Any, **kwargs: Any) -> Any:
            steps.append(("bookkeeping", threading.current_thread().name))
            return record_published(*args, **kwargs)

        routines.claim_due = claiming  # type: ignore[method-assign]
        bookkeeping.record_published = recording  # type: ignore[method-assign]
        conflicts = 0
        for _ in range(4):
            scheduler.tick()
            assert scheduler.last_report is not None
            conflicts += scheduler.last_report.conflicts
        assert steps[:4] == [
            ("claim", "MainThread"),  # batch 1
            ("claim", AHEAD_THREAD),  # batch 2, while batch 1 goes out
            ("bookkeeping", AHEAD_THREAD),  # batch 1's, while batch 2 goes out
            ("claim", AHEAD_THREAD),  # batch 3 (the last 50): batch 1 no longer due
        ]
        assert conflicts == 0
        assert_each_window_sent_once(scheduler, folder)
    finally:
        scheduler.close()


@pytest.mark.parametrize("then", ["ticks", "stops"])
def test_bookkeeping_the_next_preparation_failed_to_write_is_written_by_the_next_tick_first(
    tmp_path: Path, database_url: str, clock: FakeClock, then: str
) -> None:
    declare()
    folder = tmp_path / "broker"
    scheduler = make(folder, database_url, clock)
    try:
        adopt_all(scheduler, clock)
        bookkeeping = scheduler.store.bookkeeping
        record_published = bookkeeping.record_published
        calls: list[str] = []

        def failing_once(*args: Any, **kwargs: Any) -> Any:
            calls.append(threading.current_thread().name)
            if len(calls) == 1:  # batch 1's, handed to the preparation of batch 3
                raise OperationalError("injected", {}, Exception("connection dropped"))
            return record_published(*args, **kwargs)

        bookkeeping.record_published = failing_once  # type: ignore[method-assign]
        scheduler.tick()
        scheduler.tick()  # publishes batch 2 while batch 3's preparation fails
        assert calls == [AHEAD_THREAD]
        assert len(published(folder)) == 2 * BATCH
        if then == "stops":  # writes down all it published, then hands its claims back
            scheduler.close()
            assert calls[1:] == ["MainThread"]
            scheduler = make(folder, database_url, clock)
        else:
            scheduler.tick()  # takes the failed preparation: the beat logs it, ticks again
            assert scheduler.engine.ledger.advances  # batch 1's advances, taken back
        for _ in range(6):
            clock.advance(seconds=1)
            scheduler.tick()
        assert calls[1] == "MainThread"  # written first by the next tick (or the stopping beat)
        assert_each_window_sent_once(scheduler, folder)
    finally:
        scheduler.close()


def test_a_burst_tick_with_more_to_do_than_publish_writes_the_deferred_bookkeeping_first(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    """Bookkeeping waits for the next preparation only on a tick that does
    nothing else: one that sweeps lost runs (or refreshes, adopts, retries)
    reads the database after writing down everything published."""
    declare()
    folder = tmp_path / "broker"
    scheduler = make(folder, database_url, clock, routines_run_timeout=1)
    try:
        adopt_all(scheduler, clock)
        engine = scheduler.engine
        sweep_lost = engine.sweeps.sweep_lost
        unwritten_at_sweep: list[bool] = []

        def sweeping(*args: Any, **kwargs: Any) -> Any:
            unwritten_at_sweep.append(bool(engine.ledger))
            return sweep_lost(*args, **kwargs)

        engine.sweeps.sweep_lost = sweeping  # type: ignore[method-assign]
        scheduler.tick()  # batch 1 out; its last chunk's bookkeeping deferred
        assert engine.ledger
        clock.advance(seconds=5)  # batch 1's first runs are overdue: a sweep is due
        scheduler.tick()
        assert unwritten_at_sweep == [False]
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
