"""SIGTERM during a tick, in process (issue 18, item 3): the signal only asks
the tick to stop; it publishes what it committed (within a grace), writes it
down, hands its claims back and ends beat with status 0. The same with a real
beat process is in tests/faults/test_shutdown_real.py."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_routines import Scheduler, register
from celery_routines.sending import sender
from celery_routines.sending.publish import Publisher
from celery_routines.tick import send
from tests.conftest import FakeClock
from tests.harness import published, runs_of
from tests.tick.test_bookkeeping import make

# Three chunks of messages: the SIGTERM comes while the first goes out. The
# chunk is made small so the burst costs seconds, not a minute per database.
CHUNK = 50
ROUTINES = 3 * CHUNK - 30


@pytest.fixture(autouse=True)
def _own_signal_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def terminated_mid_tick(
    tmp_path: Path, database_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> Scheduler:
    """A beat with three chunks of due runs that receives SIGTERM while its
    first chunk of messages goes out; returns the other beat (not yet ticked)."""
    monkeypatch.setattr(sender, "PUBLISH_CHUNK", CHUNK)
    for n in range(ROUTINES):
        register("tasks.poll", timedelta(minutes=1), name=f"poll-{n:04d}")
    folder = tmp_path / "broker"
    conf = {"routines_lock_ttl": 30, "routines_batch_size": 5000}
    stopping, other = (
        make(folder, database_url, clock, **conf),
        make(folder, database_url, clock, **conf),
    )
    stopping.tick()  # adopts all: one grid
    clock.advance(minutes=1)
    inner = stopping.engine.publisher

    class TerminatedPublisher(Publisher):
        def publish_many(self, runs: Any) -> Any:
            if not published(folder):
                os.kill(os.getpid(), signal.SIGTERM)  # a real signal, mid-tick
            return inner.publish_many(runs)

        def close(self) -> None:
            inner.close()

    stopping.engine.sender.publisher = TerminatedPublisher()  # type: ignore[assignment]
    with pytest.raises(SystemExit) as stopped:
        stopping.tick()
    assert stopped.value.code == 0
    return other


def test_sigterm_mid_tick_publishes_what_was_committed_then_stops(
    tmp_path: Path, database_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What is committed goes out within the grace; the grace's own length is
    # the next test's (a loaded CI machine once ran out of it).
    monkeypatch.setattr(send, "STOP_GRACE_SECONDS", 120.0)
    other = terminated_mid_tick(tmp_path, database_url, clock, monkeypatch)
    try:
        counts = Counter(m["id"] for m in published(tmp_path / "broker"))
        assert len(counts) == ROUTINES and set(counts.values()) == {1}
        states = Counter(
            run["state"] for n in range(ROUTINES) for run in runs_of(other.store, f"poll-{n:04d}")
        )
        assert states == {"sent": ROUTINES}
        assert all(r.locked_by is None for r in other.store.routines.all())
    finally:
        other.close()


def test_a_beat_out_of_grace_leaves_the_rest_pending_and_hands_its_claims_back(
    tmp_path: Path, database_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(send, "STOP_GRACE_SECONDS", 0.0)
    other = terminated_mid_tick(tmp_path, database_url, clock, monkeypatch)
    try:
        folder = tmp_path / "broker"
        assert len(published(folder)) == sender.PUBLISH_CHUNK  # only the chunk under way
        # Within the stopped beat's claim TTL (the clock has not moved): its
        # claims were released, so the other beat sends the rest at once.
        other.tick()
        counts = Counter(m["id"] for m in published(folder))
        assert len(counts) == ROUTINES and set(counts.values()) == {1}
        states = Counter(
            run["state"] for n in range(ROUTINES) for run in runs_of(other.store, f"poll-{n:04d}")
        )
        assert states == {"sent": ROUTINES}
    finally:
        other.close()


def test_a_closed_beat_gives_the_stop_signals_back(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    # An embedder (or a test suite) that makes beat after beat in one process
    # must not stack each closed one's handler on the next: a signal would run
    # through all of them (a CI run showed 393 deep).
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for _ in range(3):
        beat = make(tmp_path / "broker", database_url, clock)
        beat.tick()
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]  # wrapped
        beat.close()
        assert {s: signal.getsignal(s) for s in before} == before
