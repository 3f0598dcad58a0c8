"""Issue 11 in process, with an injected clock: what a beat published is
never published again, whatever fails after it, and a beat whose claims were
taken over mid-tick publishes nothing of theirs."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from celery_routines import Scheduler, register
from celery_routines.sending.publish import Publisher
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published, runs_of


def make(folder: Path, database_url: str, clock: FakeClock, **conf: Any) -> Scheduler:
    return Scheduler(filesystem_app(folder, database_url, **conf), clock=clock)


def fail_once(target: Any, name: str) -> list[int]:
    """Make ``target.name`` raise a database error on its first call."""
    original = getattr(target, name)
    calls: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("injected", {}, Exception("connection dropped"))
        return original(*args, **kwargs)

    setattr(target, name, failing)
    return calls


@pytest.mark.parametrize("then", ["ticks", "stops"])
@pytest.mark.parametrize("failing", ["mark_sent", "advance", "record_published"])
def test_bookkeeping_that_fails_after_publishing_is_retried_not_republished(
    tmp_path: Path, database_url: str, clock: FakeClock, failing: str, then: str
) -> None:
    """The beat writes it on its next tick or, told to stop, before it hands
    its claims back (the next beat would otherwise send the run again)."""
    register("tasks.poll", timedelta(minutes=1), name="poll")
    scheduler = make(tmp_path / "broker", database_url, clock)
    # PostgreSQL writes both parts in one statement (record_published); the
    # other databases a statement each (mark_sent, then advance).
    if scheduler.store.bookkeeping.one_statement != (failing == "record_published"):
        scheduler.close()
        pytest.skip(f"{failing} is not a statement of this database's bookkeeping")
    try:
        scheduler.tick()  # adopts: first window 12:01
        clock.advance(minutes=1)
        queries = {
            "mark_sent": scheduler.store.runs,
            "advance": scheduler.store.routines,
            "record_published": scheduler.store.bookkeeping,
        }[failing]
        calls = fail_once(queries, failing)
        scheduler.tick()  # publishes, then the bookkeeping fails
        assert calls == [1]
        assert len(published(tmp_path / "broker")) == 1
        if then == "stops":
            scheduler.close()
            scheduler = make(tmp_path / "broker", database_url, clock)
        for _ in range(3):  # retry ticks: the bookkeeping lands, nothing goes out again
            scheduler.tick()
        messages = published(tmp_path / "broker")
        assert [m["id"] for m in messages] == [messages[0]["id"]]
        [run] = runs_of(scheduler.store, "poll")
        assert run["state"] == "sent" and run["id"] == messages[0]["id"]
        record = scheduler.store.routines.by_name("poll")
        assert record.next_run_at == clock.now + timedelta(minutes=1)
        assert record.locked_by is None
    finally:
        scheduler.close()


def test_a_beat_whose_claims_were_taken_over_mid_tick_publishes_none_of_them(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    register("tasks.poll", timedelta(minutes=1), name="poll")
    folder = tmp_path / "broker"
    slow = make(folder, database_url, clock, routines_lock_ttl=30)
    other = make(folder, database_url, clock, routines_lock_ttl=30)
    try:
        slow.tick()  # adopts
        clock.advance(minutes=1)
        engine = slow.engine
        send = engine.sender.send

        def stalled(outgoing: Any, now: Any, report: Any) -> Any:
            # The slow beat's rows are committed; it stalls past its claims,
            # and the other beat takes the routine over and sends the row.
            clock.advance(seconds=40)
            other.tick()
            return send(outgoing, now, report)

        engine.sender.send = stalled  # type: ignore[method-assign]
        slow.tick()
        counts = Counter(m["id"] for m in published(folder))
        assert list(counts.values()) == [1], counts
        [run] = runs_of(slow.store, "poll")
        assert run["state"] == "sent" and run["id"] in counts
        # The other beat moved the routine on; the slow one changed nothing.
        record = slow.store.routines.by_name("poll")
        assert record.locked_by is None
        assert record.next_run_at == clock.now.replace(second=0) + timedelta(minutes=1)
    finally:
        slow.close()
        other.close()


def test_a_long_publish_renews_its_claims_between_chunks_so_nobody_takes_them_over(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    """1,200 due runs go out in three chunks, each taking 20 s of a 30 s
    claim; another beat ticks after every chunk. The claims are renewed
    before each chunk, so the other beat never finds one expired and no run
    is published twice."""
    for n in range(1200):
        register("tasks.poll", timedelta(minutes=1), name=f"poll-{n:04d}")
    folder = tmp_path / "broker"
    conf = {"routines_lock_ttl": 30, "routines_batch_size": 5000}
    slow = make(folder, database_url, clock, **conf)
    other = make(folder, database_url, clock, **conf)
    try:
        slow.tick()  # adopts all: one grid
        clock.advance(minutes=1)
        engine = slow.engine
        inner = engine.publisher

        class SlowPublisher(Publisher):
            def publish_many(self, runs: Any) -> Any:
                errors = inner.publish_many(runs)
                clock.advance(seconds=20)
                other.tick()
                return errors

            def close(self) -> None:
                inner.close()

        engine.sender.publisher = SlowPublisher()  # type: ignore[assignment]
        slow.tick()
        counts = Counter(m["id"] for m in published(folder))
        assert len(counts) == 1200 and set(counts.values()) == {1}
        assert other.last_report is not None and other.last_report.sent == 0
        assert slow.last_report is not None and slow.last_report.sent == 1200
    finally:
        slow.close()
        other.close()


def test_a_beat_claims_fewer_routines_while_its_ticks_outlast_a_quarter_of_the_ttl(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    scheduler = make(
        tmp_path / "broker", database_url, clock, routines_lock_ttl=60, routines_batch_size=1000
    )
    try:
        engine = scheduler.engine
        engine._fit_claims_to_ttl(took=20.0, claimed=1000)  # over 15 s: halve
        assert engine.claim_limit == 500
        engine._fit_claims_to_ttl(took=20.0, claimed=3)  # slow with few: not the batch's fault
        assert engine.claim_limit == 500
        for _ in range(10):
            engine._fit_claims_to_ttl(took=30.0, claimed=engine.claim_limit)
        assert engine.claim_limit == 10  # the floor
        engine._fit_claims_to_ttl(took=1.0, claimed=10)  # well within: double back
        assert engine.claim_limit == 20
        for _ in range(10):
            engine._fit_claims_to_ttl(took=1.0, claimed=engine.claim_limit)
        assert engine.claim_limit == 1000  # never above routines_batch_size
    finally:
        scheduler.close()


def test_a_chunk_marked_sent_behind_the_next_one_was_published_first_and_a_failure_is_replayed(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    """PostgreSQL marks a published chunk sent on its own thread while the
    next chunk goes out. Only published runs are ever marked; a marking that
    fails stops the tick before another chunk goes out, its batch stays in the
    ledger, and the next tick writes it: every run is published exactly once."""
    import threading

    for n in range(1200):
        register("tasks.poll", timedelta(minutes=1), name=f"poll-{n:04d}")
    folder = tmp_path / "broker"
    scheduler = make(folder, database_url, clock, routines_batch_size=5000)
    if scheduler.engine.marking is None:
        scheduler.close()
        pytest.skip("chunks are marked sent behind the next one on PostgreSQL only")
    try:
        scheduler.tick()  # adopts all: one grid
        clock.advance(minutes=1)
        engine = scheduler.engine
        inner = engine.publisher
        out: set[str] = set()
        marked_on: list[str] = []

        class Recording(Publisher):
            def publish_many(self, runs: Any) -> Any:
                errors = inner.publish_many(runs)
                out.update(run.run_id for run in runs)
                return errors

            def close(self) -> None:
                inner.close()

        runs = scheduler.store.runs
        mark_sent = runs.mark_sent

        def checked(run_ids: Any, *args: Any, **kwargs: Any) -> Any:
            assert set(run_ids) <= out, "a run was marked sent before it was published"
            marked_on.append(threading.current_thread().name)
            if len(marked_on) == 1:
                raise OperationalError("injected", {}, Exception("connection dropped"))
            return mark_sent(run_ids, *args, **kwargs)

        engine.sender.publisher = Recording()  # type: ignore[assignment]
        runs.mark_sent = checked  # type: ignore[method-assign]
        scheduler.tick()  # chunk 1 out; its marking fails behind chunk 2; chunk 3 waits
        assert marked_on == ["celery-routines-mark-sent"]
        assert len(published(folder)) == 1000
        assert sum(len(ids) for ids, _, _ in engine.ledger.sent) == 1000
        for _ in range(3):  # the ledger first, then the pending rest
            clock.advance(seconds=1)
            scheduler.tick()
        counts = Counter(m["id"] for m in published(folder))
        assert len(counts) == 1200 and set(counts.values()) == {1}
        assert not engine.ledger
        states = Counter(
            run["state"] for n in range(1200) for run in runs_of(scheduler.store, f"poll-{n:04d}")
        )
        assert states == {"sent": 1200}
    finally:
        scheduler.close()
