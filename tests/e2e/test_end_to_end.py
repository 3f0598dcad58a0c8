"""Real celery beat and worker processes against PostgreSQL and a real broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection, Queue
from sqlalchemy import text

from celery_routines.store import Store
from tests import services
from tests.e2e.processes import CeleryProcess, environment, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[Store]:
    store = Store.from_url(postgres_url)
    yield store
    store.dispose()


def run_counts(store: Store) -> dict[tuple[str, str], int]:
    with store.engine.connect() as conn:
        try:
            rows = conn.execute(
                text(
                    "SELECT t.name, r.state, count(*) FROM routine_runs r "
                    "JOIN routines t ON t.id = r.routine_id GROUP BY t.name, r.state"
                )
            ).all()
        except Exception:
            return {}  # beat has not created the schema yet
    return {(name, state): count for name, state, count in rows}


def start(tmp_path: Path, env: dict[str, str], scheduler: str = "celery_routines.Scheduler"):
    worker = CeleryProcess(
        [
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
        ],
        env,
        tmp_path / "worker.log",
    )
    beat = CeleryProcess(
        [
            "beat",
            "-S",
            scheduler,
            "--loglevel",
            "INFO",
            "--schedule",
            str(tmp_path / "celerybeat-schedule"),
        ],
        env,
        tmp_path / "beat.log",
    )
    return worker, beat


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("scheduler", ["celery_routines.Scheduler", "routines"])
def test_beat_and_worker_on_postgres_and_redis_run_routines_to_success(
    tmp_path: Path, postgres_url: str, redis_url: str, pg_store: Store, scheduler: str
) -> None:
    env = environment(redis_url, postgres_url, E2E_INTERVAL="2", E2E_BEAT_SCHEDULE="1")
    processes = start(tmp_path, env, scheduler)
    try:
        wait_until(
            lambda: (
                run_counts(pg_store).get(("tick", "succeeded"), 0) >= 3
                and run_counts(pg_store).get(("legacy-entry", "succeeded"), 0) >= 1
            ),
            timeout=60,
            what="three succeeded runs of 'tick' and one of the beat_schedule entry",
            logs=list(processes),
        )
        # A routine inserted by plain SQL is adopted and fires without a restart.
        with pg_store.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO routines (name, task, interval_seconds, enabled, kwargs) "
                    "VALUES ('from-sql', 'e2e_app.sql_inserted', 1, true, '{\"word\": \"hi\"}')"
                )
            )
        wait_until(
            lambda: run_counts(pg_store).get(("from-sql", "succeeded"), 0) >= 1,
            timeout=30,
            what="the SQL-inserted routine to run",
            logs=list(processes),
        )
        with pg_store.engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT r.spend, r.started_at, r.finished_at, r.worker FROM routine_runs r "
                    "JOIN routines t ON t.id = r.routine_id "
                    "WHERE t.name = 'tick' AND r.state = 'succeeded' LIMIT 1"
                )
            ).one()
        assert row.spend == '{"fires": 1, "emails": 2}'
        assert row.started_at <= row.finished_at and row.worker
    finally:
        for process in processes:
            process.stop()


@pytest.mark.postgres
@pytest.mark.rabbitmq
def test_beat_and_worker_on_rabbitmq(tmp_path: Path, postgres_url: str, pg_store: Store) -> None:
    if not services.port_open("127.0.0.1", 5672):
        services.unavailable("RabbitMQ", "nothing listens on 127.0.0.1:5672")
    queue = f"routines-e2e-{uuid.uuid4().hex[:8]}"
    env = environment(services.RABBITMQ_URL, postgres_url, E2E_INTERVAL="2", E2E_QUEUE=queue)
    processes = start(tmp_path, env)
    try:
        wait_until(
            lambda: run_counts(pg_store).get(("tick", "succeeded"), 0) >= 2,
            timeout=60,
            what="two succeeded runs of 'tick' over RabbitMQ",
            logs=list(processes),
        )
    finally:
        for process in processes:
            process.stop()
        with Connection(services.RABBITMQ_URL) as connection:
            Queue(queue, channel=connection.default_channel).delete()
