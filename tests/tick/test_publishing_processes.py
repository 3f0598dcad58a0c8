"""A tick whose messages go out through publishing processes
(``routines_publish_processes``): each chunk is handed over before the
previous one's answer is read, yet a run enters the ledger (and so is marked
sent) only once its message is on the broker, each window goes out once, and
a tick left by its publishing processes still sends everything it wrote."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from celery_routines import Scheduler, register
from celery_routines.sending.offload import ProcessPublisher
from tests.conftest import FakeClock
from tests.harness import published, runs_of
from tests.tick.test_bookkeeping import make

ROUTINES = 1200  # three chunks of messages


def burst_through_processes(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> tuple[Scheduler, Path]:
    for n in range(ROUTINES):
        register("tasks.poll", timedelta(minutes=1), name=f"poll-{n:04d}")
    folder = tmp_path / "broker"
    scheduler = make(
        folder, database_url, clock, routines_publish_processes=2, routines_batch_size=5000
    )
    scheduler.tick()  # adopts all: one grid
    clock.advance(minutes=1)
    return scheduler, folder


def assert_each_window_sent_once(scheduler: Scheduler, folder: Path) -> None:
    counts = Counter(m["id"] for m in published(folder))
    assert len(counts) == ROUTINES and set(counts.values()) == {1}
    states = Counter(
        run["state"] for n in range(ROUTINES) for run in runs_of(scheduler.store, f"poll-{n:04d}")
    )
    assert states == {"sent": ROUTINES}


def test_a_run_enters_the_ledger_only_once_its_message_is_on_the_broker(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    scheduler, folder = burst_through_processes(tmp_path, database_url, clock)
    try:
        engine = scheduler.engine
        assert isinstance(engine.publisher, ProcessPublisher)
        assert len(engine.publisher.pids) == 2
        ledger = engine.ledger
        entered = ledger.published
        chunks: list[int] = []

        def checked(run_ids: Any, *args: Any, **kwargs: Any) -> Any:
            on_broker = {m["id"] for m in published(folder)}
            assert set(run_ids) <= on_broker, "a run entered the ledger before it was published"
            chunks.append(len(run_ids))
            return entered(run_ids, *args, **kwargs)

        ledger.published = checked  # type: ignore[method-assign]
        scheduler.tick()
        assert chunks == [500, 500, 200]
        assert_each_window_sent_once(scheduler, folder)
    finally:
        scheduler.close()


def test_a_tick_whose_publishing_processes_died_sends_everything_it_wrote(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    scheduler, folder = burst_through_processes(tmp_path, database_url, clock)
    try:
        publisher = scheduler.engine.publisher
        assert isinstance(publisher, ProcessPublisher)
        for pid in publisher.pids:
            os.kill(pid, signal.SIGKILL)
        scheduler.tick()
        assert publisher.pids == []
        assert_each_window_sent_once(scheduler, folder)
    finally:
        scheduler.close()


def test_a_marking_that_fails_behind_a_chunk_in_flight_raises_once_and_is_replayed(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    # Chunk 1's marking fails on its thread while chunks 2 and 3 are handed
    # over; the tick fails when it starts chunk 2's marking, with chunk 3
    # still in flight: it waits for chunk 3's answer once (it hung, reading
    # chunk 2's answer a second time), enters both, and the next ticks write
    # the ledger and send nothing twice.
    scheduler, folder = burst_through_processes(tmp_path, database_url, clock)
    try:
        if scheduler.engine.marking is None:
            pytest.skip("chunks are marked sent behind the next one on PostgreSQL only")
        runs = scheduler.store.runs
        mark_sent = runs.mark_sent
        calls: list[int] = []

        def failing_once(run_ids: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(len(run_ids))
            if len(calls) == 1:
                raise OperationalError("injected", {}, Exception("connection dropped"))
            return mark_sent(run_ids, *args, **kwargs)

        runs.mark_sent = failing_once  # type: ignore[method-assign]
        # Beat logs a failed tick and goes on; run it on a thread so a hang fails.
        ticking = threading.Thread(target=scheduler.tick, daemon=True)
        ticking.start()
        ticking.join(timeout=60)
        if ticking.is_alive():
            publisher = scheduler.engine.publisher
            assert isinstance(publisher, ProcessPublisher)
            for pid in publisher.pids:  # end-of-file frees the hung read
                os.kill(pid, signal.SIGKILL)
            ticking.join(timeout=30)
            pytest.fail("the tick hung waiting for an answer it had already read")
        assert calls == [500]  # the failed marking; the tick stopped at it
        assert sum(len(ids) for ids, _, _ in scheduler.engine.ledger.sent) == ROUTINES
        for _ in range(3):  # the ledger first, then nothing left
            clock.advance(seconds=1)
            scheduler.tick()
        assert not scheduler.engine.ledger
        assert_each_window_sent_once(scheduler, folder)
    finally:
        scheduler.close()
