"""Runs and connections the worker tests share: a ``sent`` run row as beat
leaves it, a task registered as a routine, a database backend cut."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from celery import Celery
from sqlalchemy import create_engine, text

from celery_routines import register
from celery_routines.clock import utc_now
from celery_routines.store import NewRun, Store
from celery_routines.worker.connection import kept_for
from tests.harness import insert_routine


def sent_run(store: Store, routine: str, **columns: Any) -> str:
    record = store.routines.by_name(routine)
    if record is None:
        insert_routine(store, routine, interval_seconds=60, **columns)
        record = store.routines.by_name(routine)
    now = utc_now()
    run_id = str(uuid.uuid4())
    store.runs.insert_new(
        [
            NewRun(
                id=run_id,
                routine_id=record.id,
                idempotency_key=f"{routine}@{now.isoformat()}",
                attempt=1,
                scheduled_for=now,
            )
        ],
        now,
    )
    store.runs.mark_sent([run_id], now)
    return run_id


def routine_task(app: Celery, routine: str) -> Any:
    @app.task(name=f"tests.worker.statements.{uuid.uuid4().hex[:8]}")
    def job() -> str:
        return "done"

    register(job, timedelta(hours=1), name=routine)
    return job


def backend_pid(store: Store) -> int:
    """The backend of a connection from ``store``'s pool."""
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT pg_backend_pid()")).scalar_one()


def kept_backend_pid(store: Store) -> int:
    kept = kept_for(store)
    assert kept is not None
    with kept.connection() as conn:
        return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()


def cut(postgres_url: str, pid: int) -> None:
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    admin.dispose()
