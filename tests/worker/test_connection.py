"""The worker's kept connection (``worker/connection.py``): a run's claim and
outcome check nothing out of the pool; a kept connection idle past its ping
threshold is pinged, and replaced if it was cut; a forked pool process never
uses nor closes the connection its parent kept. PostgreSQL: elsewhere the
store checks its connections out itself."""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import event

from celery_routines import register
from celery_routines.clock import utc_now
from celery_routines.store import Store
from celery_routines.worker import hooks as worker
from celery_routines.worker.connection import KeptConnection
from tests.harness import migrated_store
from tests.worker.runs import cut, kept_backend_pid, routine_task, sent_run


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[Store]:
    yield from migrated_store(postgres_url)


@pytest.fixture
def pg_app(postgres_url: str, pg_store: Store, monkeypatch: pytest.MonkeyPatch) -> Celery:
    monkeypatch.setattr(worker, "clock", utc_now)  # deadlines on the database's clock
    app = Celery("kept_test", set_as_current=False)
    app.conf.update(routines_database_url=postgres_url, broker_url="memory://")
    return app


def backend_of(kept: KeptConnection) -> int:
    with kept.connection() as conn:
        return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()


def test_a_run_checks_no_connection_out_of_the_pool_once_one_is_kept(
    pg_app: Celery, pg_store: Store
) -> None:
    task = routine_task(pg_app, "kept")
    task.apply(task_id=sent_run(pg_store, "kept"), headers={"routine": "kept"}).get()
    store = worker.store_for(pg_app)
    kept_backend = kept_backend_pid(store)
    checkouts: list[Any] = []

    def checkout(*args: Any) -> None:
        checkouts.append(args)

    event.listen(store.engine, "checkout", checkout)
    try:
        run_id = sent_run(pg_store, "kept")
        task.apply(task_id=run_id, headers={"routine": "kept"}).get()
    finally:
        event.remove(store.engine, "checkout", checkout)

    assert pg_store.runs.get(run_id).state == "succeeded"
    assert checkouts == []
    assert kept_backend_pid(store) == kept_backend


def test_a_duplicate_delivery_claimed_on_the_kept_connection_does_not_run_the_body(
    pg_app: Celery, pg_store: Store
) -> None:
    ran: list[str] = []

    @pg_app.task(name=f"tests.worker.kept.{uuid.uuid4().hex[:8]}")
    def job() -> None:
        ran.append("job")

    register(job, timedelta(hours=1), name="twice")
    run_id = sent_run(pg_store, "twice")
    for _ in range(2):
        job.apply(task_id=run_id, headers={"routine": "twice"})

    assert ran == ["job"]
    run = pg_store.runs.get(run_id)
    assert (run.state, run.duplicates) == ("succeeded", 1)


def test_a_kept_connection_cut_while_idle_is_replaced_before_its_next_statement(
    postgres_url: str, pg_store: Store
) -> None:
    kept = KeptConnection(pg_store.engine, ping_after_idle=0.0)  # always idle long enough
    first = backend_of(kept)
    cut(postgres_url, first)

    assert backend_of(kept) != first  # pinged, found cut, replaced: no statement failed
    kept.close()


def test_a_kept_connection_used_a_moment_ago_is_not_pinged(pg_store: Store) -> None:
    kept = KeptConnection(pg_store.engine, ping_after_idle=30.0)
    backend_of(kept)
    pings: list[object] = []
    ping = pg_store.engine.dialect.do_ping
    pg_store.engine.dialect.do_ping = lambda conn: pings.append(conn) or ping(conn)  # type: ignore[method-assign]
    try:
        backend_of(kept)
    finally:
        del pg_store.engine.dialect.do_ping
    assert pings == []
    kept.close()


def test_a_forked_process_neither_uses_nor_closes_the_connection_its_parent_kept(
    pg_store: Store,
) -> None:
    kept = KeptConnection(pg_store.engine)
    parent_backend = backend_of(kept)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child process)
        answer = b"error"
        try:
            pg_store.engine.dispose(close=False)  # as the worker's after_fork does
            answer = str(backend_of(kept)).encode()
            gc.collect()  # whatever the child dropped of its parent's is finalized now
        finally:
            os.write(write, answer)
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(child, 0)
    answer = os.read(read, 64)
    os.close(read)

    assert status == 0 and answer != b"error"
    assert int(answer) != parent_backend  # the child used a connection of its own
    assert backend_of(kept) == parent_backend  # and the parent's still works
    kept.close()
