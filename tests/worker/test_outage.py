"""The worker through a database it cannot reach: each of its statements (the
claim, the outcome) cut before it reaches the server, or after the server ran
it and before the answer came back, for a few tries or for longer than
``routines_database_patience``. Whatever the cut, the body runs once and the
run ends once, never left ``sent`` or ``running``.

The cut is injected on the real database (every supported one): the driver's
own error for a lost connection is raised around the chosen statement, as an
aborted TCP connection or a refused connect reports it. The outage soak
(tests/faults/test_outage_soak_real.py) cuts real connections with a proxy.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, signals
from sqlalchemy import Engine, event

from celery_routines.store import Store
from celery_routines.worker import heartbeat, outcomes
from celery_routines.worker import hooks as worker
from celery_routines.worker.hand_back import RELEASED_HEADER
from celery_routines.worker.pending import (
    OutcomeSpool,
    PendingOutcome,
    PendingOutcomes,
    database_key,
)
from celery_routines.worker.stores import forget_stores, store_for
from tests.conftest import FakeClock
from tests.worker.test_hooks import calls, deliver, make_run, register_task

# What a statement of each kind holds, spaces and quotes left out.
CLAIM = ("UPDATEroutine_runs", "started_at=")
HEARTBEAT = ("UPDATEroutine_runs", "SETdeadline_at=")
SUCCESS = ("UPDATEroutine_runs", "spend=", "routine_runs.reason=")
FAILURE = ("UPDATEroutine_runs", "spend=", "routine_runs.stateIN")


class Cut:
    """Makes statements containing ``marker`` fail as a lost connection,
    ``times`` times: ``before`` the server sees them, or ``after`` it ran
    (and, autocommitted, kept) them."""

    def __init__(self, marker: tuple[str, ...], times: int, when: str = "before") -> None:
        self.marker, self.times, self.when = marker, times, when
        self.cuts = 0
        self._lock = threading.Lock()

    def _due(self, statement: str) -> bool:
        squashed = statement.replace(" ", "").replace('"', "").replace("`", "")
        if not all(part in squashed for part in self.marker):
            return False
        with self._lock:
            if self.cuts >= self.times:
                return False
            self.cuts += 1
            return True

    def before(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if self.when == "before" and self._due(statement):
            raise lost_connection(conn)

    def after(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if self.when == "after" and self._due(statement):
            raise lost_connection(conn)


def lost_connection(conn: Any) -> Exception:
    """The driver's own error for a connection that broke mid-statement."""
    dbapi = conn.dialect.loaded_dbapi
    if conn.dialect.name == "mysql":
        return dbapi.OperationalError(2013, "Lost connection to MySQL server during query")
    if conn.dialect.name == "sqlite":  # no connection to lose: another writer holds the file
        return dbapi.OperationalError("database is locked")
    return dbapi.OperationalError("server closed the connection unexpectedly")


@pytest.fixture
def cut(outage_app: Celery) -> Iterator[list[Cut]]:
    """Cuts on the worker's own engine only: the test reads through its own."""
    installed: list[Cut] = []
    yield installed
    engine = store_for(outage_app).engine
    for one in installed:
        event.remove(engine, "before_cursor_execute", one.before)
        event.remove(engine, "after_cursor_execute", one.after)


def install(
    installed: list[Cut], app: Celery, marker: tuple[str, ...], times: int, when: str = "before"
) -> Cut:
    one = Cut(marker, times, when)
    engine: Engine = store_for(app).engine
    event.listen(engine, "before_cursor_execute", one.before)
    event.listen(engine, "after_cursor_execute", one.after)
    installed.append(one)
    return one


@pytest.fixture(autouse=True)
def _reset(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    calls.clear()
    monkeypatch.setattr(worker, "clock", clock)


@pytest.fixture
def outage_app(app: Celery, tmp_path: Path) -> Celery:
    app.conf.routines_database_patience = 1.5
    app.conf.routines_outcome_spool = str(tmp_path / "kept.sqlite3")
    forget_stores()
    return app


def recording_job(app: Celery) -> Any:
    """A routine task ``job`` whose body notes each run in ``calls``."""

    @register_task(app, "job")
    def job() -> str:
        calls.append("job")
        return "ok"

    return job


@pytest.fixture
def republished() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def record(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.append(dict(headers or {}))

    signals.before_task_publish.connect(record, weak=False)
    yield seen
    signals.before_task_publish.disconnect(record)


@pytest.mark.parametrize("times", [1, 2])
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_claim_cut_for_a_moment_runs_the_body_once(
    outage_app: Celery, store: Store, cut: list[Cut], when: str, times: int
) -> None:
    job = recording_job(outage_app)
    run_id = make_run(store, "job")
    claim = install(cut, outage_app, CLAIM, times=times, when=when)
    result = deliver(job, run_id, "job")
    assert claim.cuts == times
    # "after": the first cut try did claim the run for this delivery; the next
    # try takes over what it left instead of refusing itself as a duplicate.
    assert (calls, result.state) == (["job"], "SUCCESS")
    run = store.runs.get(run_id)
    assert (run.state, run.duplicates) == ("succeeded", 0)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_claim_that_cannot_reach_the_database_hands_the_delivery_back_and_it_runs_once_later(
    outage_app: Celery,
    store: Store,
    cut: list[Cut],
    republished: list[dict[str, Any]],
    when: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = recording_job(outage_app)
    run_id = make_run(store, "job")
    install(cut, outage_app, CLAIM, times=10_000, when=when)
    with caplog.at_level(logging.WARNING, "celery_routines.worker"):
        result = deliver(job, run_id, "job")
    # Not a FAILURE for a database blip: Celery's RETRY, and the body did not run.
    assert (calls, result.state) == ([], "RETRY")
    assert len(republished) == 1
    headers = republished[0]
    assert headers["id"] == run_id and headers["routine"] == "job"
    assert "handed back to the broker" in caplog.text
    # "after": the run is left running by a claim whose answer never came
    # (SQLite's claim runs in a transaction, which the cut rolls back).
    landed = when == "after" and store.engine.dialect.name != "sqlite"
    assert store.runs.get(run_id).state == ("running" if landed else "sent")

    # The database is back; the handed-back message comes again.
    cut.pop().times = 0
    again = job.apply(task_id=run_id, headers={k: headers[k] for k in ("routine", RELEASED_HEADER)})
    assert (calls, again.state) == (["job"], "SUCCESS")
    run = store.runs.get(run_id)
    assert (run.state, run.duplicates) == ("succeeded", 0)


def test_a_duplicate_delivery_still_refuses_a_run_another_delivery_holds(
    outage_app: Celery, store: Store
) -> None:
    # The take-over is for the claims the message names, not any running row.
    job = recording_job(outage_app)
    run_id = make_run(store, "job")
    assert store.outcomes.claim_start(run_id, "other-worker", store.db_now())
    foreign = [["this-worker", "2026-11-30T12:00:00+00:00"]]
    result = job.apply(task_id=run_id, headers={"routine": "job", RELEASED_HEADER: foreign})
    assert (calls, result.state) == ([], "IGNORED")
    assert store.runs.get(run_id).state == "running"


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_outcome_cut_for_a_moment_is_written_once(
    outage_app: Celery,
    store: Store,
    cut: list[Cut],
    when: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = recording_job(outage_app)
    run_id = make_run(store, "job")
    outcome = install(cut, outage_app, SUCCESS, times=2, when=when)
    with caplog.at_level(logging.WARNING, "celery_routines.worker"):
        deliver(job, run_id, "job")
    assert outcome.cuts == 2
    assert store.runs.get(run_id).state == "succeeded"
    assert "declared lost or replaced" not in caplog.text


@pytest.mark.parametrize("succeeds", [True, False])
def test_an_outcome_the_database_does_not_take_is_kept_and_written_when_it_is_back(
    outage_app: Celery, store: Store, cut: list[Cut], clock: FakeClock, succeeds: bool
) -> None:
    @register_task(outage_app, "job")
    def job() -> str:
        calls.append("job")
        if not succeeds:
            raise RuntimeError("boom")
        return "ok"

    run_id = make_run(store, "job", max_retries=0)
    outage = install(cut, outage_app, SUCCESS if succeeds else FAILURE, times=10_000)
    deliver(job, run_id, "job")
    assert calls == ["job"]
    assert store.runs.get(run_id).state == "running"  # the outcome waits
    kept = outcomes.pending_for(outage_app)
    assert [o.run_id for o in kept.waiting] == [run_id]

    # A worker restarted meanwhile finds the outcome in the host's spool.
    later = PendingOutcomes(
        database_key(outage_app.conf.routines_database_url),
        OutcomeSpool(outage_app.conf.routines_outcome_spool),
        kept._write,
    )
    assert later.recover() == 1
    assert not later.write_all()  # still away: kept, not dropped
    assert len(later.waiting) == 1

    outage.times = 0  # the database is back
    assert later.write_all()
    run = store.runs.get(run_id)
    assert run.state == ("succeeded" if succeeds else "failed")
    assert run.finished_at == clock.now
    assert later.spool.load(later.database) == []
    # This process's own keeper finds it written and changes nothing.
    assert kept.write_all()
    assert store.runs.get(run_id).state == run.state


def test_a_spool_that_cannot_be_written_keeps_outcomes_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = OutcomeSpool(str(tmp_path / "missing-folder" / "kept.sqlite3"))
    pending = PendingOutcomes("db", spool, write=lambda outcome: None)
    outcome = PendingOutcome(str(uuid.uuid4()), "job", True, datetime.now(UTC))
    with caplog.at_level(logging.WARNING, "celery_routines.worker"):
        pending.spool.add("db", outcome)
    assert "kept in this process only" in caplog.text


def test_a_heartbeat_cut_costs_one_beat_and_the_next_pushes_the_deadline(
    outage_app: Celery,
    store: Store,
    cut: list[Cut],
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker_store = store_for(outage_app)
    run_id = make_run(store, "job")
    assert store.outcomes.claim_start(run_id, "w1", clock.now, deadline_at=clock.now)
    beats = install(cut, outage_app, HEARTBEAT, times=1)
    with caplog.at_level(logging.WARNING, "celery_routines.worker"):
        beating = heartbeat.start(run_id, 0.3, worker_store.outcomes.heartbeat, lambda: clock.now)
        try:
            deadline = time.monotonic() + 10
            while beating.beats < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            heartbeat.stop(run_id)
    assert beats.cuts == 1 and beating.beats >= 1
    assert store.runs.get(run_id).deadline_at == clock.now + timedelta(seconds=0.3)
    assert "could not reach the database" in caplog.text
    assert "Traceback" not in caplog.text


def test_a_drivers_own_error_escaping_sqlalchemy_is_a_connection_fault_only_when_it_is_one() -> (
    None
):
    # PyMySQL's error from the rollback that ends a block on a dead connection
    # reaches the worker unwrapped (seen in the outage soak on MariaDB).
    import psycopg
    import pymysql

    from celery_routines.store.faults import database_unreachable

    assert database_unreachable(pymysql.err.OperationalError(2013, "Lost connection"))
    assert database_unreachable(pymysql.err.OperationalError(2006, "MySQL server has gone away"))
    assert not database_unreachable(pymysql.err.OperationalError(1213, "Deadlock found"))
    assert database_unreachable(psycopg.OperationalError("connection failed"))
    assert database_unreachable(ConnectionResetError(104, "Connection reset by peer"))
    assert not database_unreachable(ValueError("not a fault"))
