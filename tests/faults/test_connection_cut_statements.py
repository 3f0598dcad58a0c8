"""A beat whose database connection is really cut at one statement of its
tick neither sends a window twice nor skips one.

Two in-process beats on one real PostgreSQL (kombu's filesystem transport,
an injected clock) tick in turn over six minutely windows of two routines
with no worker: each run is declared lost after its ``run_timeout`` and
retried once, so a tick's claim, its run rows, its commit, the marking of
its runs ``sent``, the lost sweep and the retry sweep all run. The first
beat's connection is cut (its socket shut down: see
``tests/faults/connection_cuts.py``) at the first statement of one kind,
before the server saw it or after the server ran it and the answer was
lost. Then both beats tick on, and every window must have one first attempt,
every run row must have gone out exactly once, and none may be left pending.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import pytest
from sqlalchemy import create_engine, text

from celery_routines import Scheduler, register
from tests.conftest import FakeClock
from tests.faults.connection_cuts import ConnectionCut
from tests.harness import filesystem_app, published

pytestmark = [pytest.mark.postgres]

ROUTINES = ("poll-a", "poll-b")
WINDOWS = [datetime(2026, 11, 30, 12, minute, tzinfo=UTC) for minute in range(1, 7)]
LOCK_TTL = 10
# A first attempt in these states may not have met its retry yet.
OPEN_OR_WAITING = ("pending", "sent", "running", "retrying")

# What the tick says to PostgreSQL, by the first words of its statements.
STATEMENTS = {
    "claim": "WITH due AS MATERIALIZED",
    "run rows": "INSERT INTO routine_runs",
    "commit": "COMMIT",
    "mark sent": "WITH marked",
    "lost sweep": "UPDATE routine_runs SET state=%(state)s::VARCHAR, reason=",
    "retry sweep": "UPDATE routine_runs SET state=%(state)s::VARCHAR WHERE",
}


@pytest.mark.parametrize("mode", ["before", "after"])
@pytest.mark.parametrize("kind", list(STATEMENTS))
def test_a_connection_cut_at_any_statement_sends_each_window_once(
    tmp_path: Path, postgres_url: str, kind: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))
    for name in ROUTINES:
        register(
            "tasks.poll",
            timedelta(minutes=1),
            name=name,
            overlap="overlap",
            run_timeout=90,
            max_retries=1,
            retry_base_seconds=10,
        )
    folder = tmp_path / "broker"
    conf = {"routines_lock_ttl": LOCK_TTL}
    beats = [Scheduler(filesystem_app(folder, postgres_url, **conf), clock=clock) for _ in range(2)]
    try:
        cut = ConnectionCut(beats[0].store.engine, STATEMENTS[kind], mode)
        beats[0].tick()  # adopts: the first windows are 12:01
        cut.arm()
        with caplog.at_level(logging.WARNING, logger="celery_routines"):
            while clock.now < datetime(2026, 11, 30, 12, 6, 30, tzinfo=UTC):
                for beat in beats:  # the cut beat first: its statements meet the fault
                    beat.tick()
                clock.advance(seconds=5)
        assert cut.cut is not None, f"no statement started with {STATEMENTS[kind]!r}"
        failures = [r for r in caplog.records if r.getMessage().startswith("beat tick failed")]
        assert failures, "the cut failed no tick"
        assert all(r.levelno == logging.WARNING and r.exc_info is None for r in failures)
        check_each_window_once(postgres_url, folder)
    finally:
        for beat in beats:
            beat.close()


class RunRow(NamedTuple):
    id: str
    name: str
    scheduled_for: datetime
    attempt: int
    state: str


def check_each_window_once(database_url: str, folder: Path) -> None:
    engine = create_engine(database_url)  # not the cut beat's
    try:
        with engine.connect() as conn:
            fetched = conn.execute(
                text(
                    "SELECT r.id, t.name, r.scheduled_for, r.attempt, r.state "
                    "FROM routine_runs r JOIN routines t ON t.id = r.routine_id"
                )
            ).all()
    finally:
        engine.dispose()
    # Windows read back naive (UTC) through plain text SQL.
    rows = [
        RunRow(row.id, row.name, row.scheduled_for.replace(tzinfo=UTC), row.attempt, row.state)
        for row in fetched
    ]
    shown = "\n".join(
        sorted(f"{row.name} {row.scheduled_for:%H:%M} #{row.attempt} {row.state}" for row in rows)
    )
    attempts = Counter((row.name, row.scheduled_for, row.attempt) for row in rows)
    assert all(n == 1 for n in attempts.values()), shown
    firsts = {(row.name, row.scheduled_for) for row in rows if row.attempt == 1}
    assert firsts == {(name, window) for name in ROUTINES for window in WINDOWS}, shown
    assert not [row for row in rows if row.state in ("pending", "skipped")], shown
    # An attempt declared lost (and settled) with a retry left was retried:
    # its retry is not lost either.
    retried = {(row.name, row.scheduled_for) for row in rows if row.attempt == 2}
    settled = {(row.name, row.scheduled_for) for row in rows if row.attempt == 1}
    settled -= {(row.name, row.scheduled_for) for row in rows if row.state in OPEN_OR_WAITING}
    assert settled and settled <= retried, shown
    counts = Counter(message["id"] for message in published(folder))
    assert {run_id for run_id, n in counts.items() if n > 1} == set(), shown
    assert set(counts) == {row.id for row in rows}, shown
