"""The run lifecycle with real workers on Redis and PostgreSQL.

Worker subprocesses run tests/e2e/e2e_app.py; beat runs either as a real
``celery beat`` subprocess (the SIGKILL test, on the real clock) or in this
process with an injected clock, ticked by the test (overlap policies, pause).
The retry-backoff test runs a real worker in a thread of this process so that
the worker records outcomes on the same injected clock.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from celery_routines import Scheduler, register
from celery_routines.clock import utc_now
from celery_routines.observe.metrics import RoutineMetrics
from celery_routines.store import NewRun, RunRecord, Store
from celery_routines.worker import hooks as worker
from tests.conftest import FakeClock
from tests.e2e.processes import CeleryProcess, environment, wait_until
from tests.harness import insert_routine, redis_app, runs_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture
def queue() -> str:
    return f"lifecycle-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pg_store(postgres_url: str, migrated_schema: None) -> Iterator[Store]:
    store = Store.from_url(postgres_url)
    store.migrate()
    yield store
    store.dispose()


@pytest.fixture
def processes() -> Iterator[list[CeleryProcess]]:
    started: list[CeleryProcess] = []
    yield started
    for process in started:
        process.stop()


def start_worker(
    tmp_path: Path,
    env: dict[str, str],
    processes: list[CeleryProcess],
    *,
    pool: str = "solo",
    concurrency: int = 1,
) -> CeleryProcess:
    number = len(processes)
    process = CeleryProcess(
        [
            "worker",
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "--loglevel",
            "INFO",
            "--hostname",
            f"w{number}@%h",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
        ],
        env,
        tmp_path / f"worker{number}.log",
    )
    processes.append(process)
    return process


def runs_of(store: Store, name: str) -> list[RunRecord]:
    record = store.routines.by_name(name)
    if record is None:
        return []
    return sorted(
        runs_for(store, record.id), key=lambda r: (r.scheduled_for, r.attempt, r.created_at)
    )


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize(
    ("pool", "concurrency", "task"),
    [("solo", 1, "e2e_app.record"), ("prefork", 2, "e2e_app.hold")],
    ids=["after-it-finished", "while-it-runs"],
)
def test_a_message_delivered_twice_runs_its_body_once(
    pool: str,
    concurrency: int,
    task: str,
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    pg_store: Store,
    queue: str,
    processes: list[CeleryProcess],
) -> None:
    body_log, release = tmp_path / "body.log", tmp_path / "release"
    env = environment(redis_url, postgres_url, E2E_QUEUE=queue, E2E_INTERVAL="3600")
    worker_process = start_worker(tmp_path, env, processes, pool=pool, concurrency=concurrency)
    routine_id = insert_routine(pg_store, "dup", task=task, interval_seconds=3600)
    # Beat's run metrics, read from the database (no settling lag here).
    metrics = RoutineMetrics()
    metrics.runs.settle = timedelta(0)
    metrics.runs.read(pg_store)
    run_id = str(uuid.uuid4())
    now = utc_now()
    pg_store.runs.insert_new(
        [NewRun(run_id, routine_id, "dup@manual", 1, now.replace(microsecond=0))], now
    )
    pg_store.runs.mark_sent([run_id], now)
    app = redis_app(redis_url, postgres_url, task_default_queue=queue)
    kwargs: dict[str, Any] = {"path": str(body_log)}
    if task == "e2e_app.hold":
        kwargs["release"] = str(release)  # the body runs until the test releases it
    for _ in range(2):  # the same message, twice: what a redelivery looks like
        app.send_task(task, kwargs=kwargs, task_id=run_id, headers={"routine": "dup"})
    wait_until(
        lambda: (run := pg_store.runs.get(run_id)) is not None and run.duplicates == 1,
        timeout=25,
        what="the worker to refuse the second delivery",
        logs=[worker_process],
    )
    expected_state = "running" if task == "e2e_app.hold" else "succeeded"
    assert f"refused a delivery of run {run_id}" in worker_process.output()
    assert f"already {expected_state}" in worker_process.output()
    release.touch()
    wait_until(
        lambda: pg_store.runs.get(run_id).state == "succeeded",
        timeout=25,
        what="the run to succeed",
        logs=[worker_process],
    )
    # One body run: "ran <id>" (record) or "start <id> <pid>" (hold), once.
    body_runs = [line.split()[:2] for line in lines(body_log) if not line.startswith("end")]
    assert body_runs in ([["ran", run_id]], [["start", run_id]])
    # Counted by the worker process that refused it (a pool child under
    # prefork), exported by beat from the database.
    metrics.runs.read(pg_store)
    sample = metrics.registry.get_sample_value
    assert sample("routines_worker_duplicates_refused_total", {"routine": "dup"}) == 1
    assert sample("routines_run_outcomes_total", {"routine": "dup", "state": "succeeded"}) == 1
    assert sample("routines_run_duration_seconds_count", {"routine": "dup"}) == 1
    assert sample("routines_run_start_lateness_seconds_count", {"routine": "dup"}) == 1


def test_sigkill_of_a_worker_mid_task_gives_a_lost_run_and_a_retry(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    pg_store: Store,
    queue: str,
    processes: list[CeleryProcess],
) -> None:
    body_log, release = tmp_path / "body.log", tmp_path / "release"
    env = environment(
        redis_url, postgres_url, E2E_QUEUE=queue, E2E_INTERVAL="3600", ROUTINES_RUN_TIMEOUT="4"
    )
    insert_routine(
        pg_store,
        "slow",
        task="e2e_app.hold",
        interval_seconds=3600,
        kwargs=json.dumps({"path": str(body_log), "release": str(release)}),
        max_retries=2,
        retry_base_seconds=1,
        next_run_at=utc_now().replace(tzinfo=None, microsecond=0),  # due now
    )
    doomed = start_worker(tmp_path, env, processes)
    beat = CeleryProcess(
        ["beat", "-S", "routines", "--loglevel", "INFO", "-s", str(tmp_path / "beat-schedule")],
        env,
        tmp_path / "beat.log",
    )
    processes.append(beat)
    wait_until(
        lambda: any(line.startswith("start") for line in lines(body_log)),
        timeout=25,
        what="the slow task to start",
        logs=[doomed, beat],
    )
    [first] = runs_of(pg_store, "slow")
    assert first.state == "running"
    os.killpg(doomed.process.pid, signal.SIGKILL)  # mid-task, no goodbye
    doomed.process.wait(timeout=5)
    processes.remove(doomed)
    release.touch()
    wait_until(
        lambda: pg_store.runs.get(first.id).reason == "lost",
        timeout=15,
        what="beat to declare the run lost",
        logs=[beat],
    )
    start_worker(tmp_path, env, processes)
    wait_until(
        lambda: (
            [(r.attempt, r.state) for r in runs_of(pg_store, "slow")]
            == [(1, "lost"), (2, "succeeded")]
        ),
        timeout=20,
        what="the retry to succeed",
        logs=processes,
    )
    lost = pg_store.runs.get(first.id)
    assert "worker was probably lost" in lost.error
    assert "declared lost" in beat.output()


def test_sigkill_of_a_pool_process_mid_task_is_reported_lost_at_once_and_retried(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    pg_store: Store,
    queue: str,
    processes: list[CeleryProcess],
) -> None:
    # The worker's main process survives and reports WorkerLostError: no need
    # to wait for the deadline (an hour here).
    body_log, release = tmp_path / "body.log", tmp_path / "release"
    env = environment(redis_url, postgres_url, E2E_QUEUE=queue, E2E_INTERVAL="3600")
    insert_routine(
        pg_store,
        "slow",
        task="e2e_app.hold",
        interval_seconds=3600,
        kwargs=json.dumps({"path": str(body_log), "release": str(release)}),
        retry_base_seconds=1,
        next_run_at=utc_now().replace(tzinfo=None, microsecond=0),
    )
    start_worker(tmp_path, env, processes, pool="prefork", concurrency=1)
    beat = CeleryProcess(
        ["beat", "-S", "routines", "--loglevel", "INFO", "-s", str(tmp_path / "beat-schedule")],
        env,
        tmp_path / "beat.log",
    )
    processes.append(beat)
    wait_until(
        lambda: any(line.startswith("start") for line in lines(body_log)),
        timeout=25,
        what="the slow task to start",
        logs=processes,
    )
    [first] = runs_of(pg_store, "slow")
    child_pid = int(next(line for line in lines(body_log) if line.startswith("start")).split()[2])
    release.touch()  # the retry will not wait
    os.kill(child_pid, signal.SIGKILL)
    wait_until(
        lambda: (
            [(r.attempt, r.state) for r in runs_of(pg_store, "slow")]
            == [(1, "lost"), (2, "succeeded")]
        ),
        timeout=20,
        what="the lost attempt to be retried to success",
        logs=processes,
    )
    lost = pg_store.runs.get(first.id)
    assert (lost.reason, lost.error.split(":")[0]) == ("lost", "WorkerLostError")


# -- overlap policies: beat in this process on an injected clock ----------------


def overlap_setup(
    policy: str, tmp_path: Path, postgres_url: str, redis_url: str, queue: str
) -> tuple[Scheduler, FakeClock, Path, Path]:
    body_log, release = tmp_path / "body.log", tmp_path / "release"
    register(
        "e2e_app.hold",
        timedelta(minutes=1),
        name="slow",
        overlap=policy,
        kwargs={"path": str(body_log), "release": str(release)},
    )
    # Start on the real clock: the worker stamps deadlines with it.
    clock = FakeClock(utc_now().replace(second=0, microsecond=0))
    app = redis_app(redis_url, postgres_url, task_default_queue=queue)
    return Scheduler(app, clock=clock), clock, body_log, release


def started(body_log: Path) -> list[str]:
    return [line.split()[1] for line in lines(body_log) if line.startswith("start")]


def ended(body_log: Path) -> list[str]:
    return [line.split()[1] for line in lines(body_log) if line.startswith("end")]


@pytest.mark.parametrize("policy", ["skip", "queue", "overlap", "replace"])
def test_overlap_policies_with_a_slow_task(
    policy: str,
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    pg_store: Store,
    queue: str,
    processes: list[CeleryProcess],
) -> None:
    beat, clock, body_log, release = overlap_setup(policy, tmp_path, postgres_url, redis_url, queue)
    env = environment(redis_url, postgres_url, E2E_QUEUE=queue, E2E_INTERVAL="3600")
    workers = [start_worker(tmp_path, env, processes, pool="prefork", concurrency=2)]
    try:
        beat.tick()
        clock.advance(minutes=1)
        beat.tick()
        [first] = runs_of(pg_store, "slow")
        wait_until(
            lambda: started(body_log) == [first.id],
            timeout=25,
            what="the first run to start",
            logs=workers,
        )
        clock.advance(minutes=1)  # the next window falls due while it runs
        beat.tick()
        beat.tick()
        rows = runs_of(pg_store, "slow")
        if policy == "skip":
            assert [(r.state, r.reason) for r in rows] == [
                ("running", None),
                ("skipped", "overlap"),
            ]
        elif policy == "queue":
            assert [r.id for r in rows] == [first.id]
            release.touch()
            wait_until(
                lambda: pg_store.runs.get(first.id).state == "succeeded",
                timeout=25,
                what="the first run to end",
                logs=workers,
            )
            beat.tick()  # the first tick after it ended sends the queued window
            rows = runs_of(pg_store, "slow")
            assert next(r.state for r in rows) == "succeeded" and len(rows) == 2
        elif policy == "overlap":
            second = rows[1]
            wait_until(
                lambda: started(body_log) == [first.id, second.id],
                timeout=25,
                what="both runs to run at once",
                logs=workers,
            )
            assert ended(body_log) == []
        else:  # replace
            second = rows[1]
            replaced = pg_store.runs.get(first.id)
            assert (replaced.state, replaced.reason) == ("failed", "replaced")
            wait_until(
                lambda: started(body_log) == [first.id, second.id],
                timeout=25,
                what="the new window to start",
                logs=workers,
            )
        release.touch()
        wait_until(
            lambda: all(
                r.state in ("succeeded", "skipped", "failed") for r in runs_of(pg_store, "slow")
            ),
            timeout=25,
            what="every run to finish",
            logs=workers,
        )
        rows = runs_of(pg_store, "slow")
        if policy == "replace":
            # The replaced run was terminated: it never reached its end, and
            # the worker's report of the kill did not overwrite "replaced".
            assert ended(body_log) == [rows[1].id]
            assert (rows[0].state, rows[0].reason, rows[1].state) == (
                "failed",
                "replaced",
                "succeeded",
            )
        else:
            assert all(r.state in ("succeeded", "skipped") for r in rows)
    finally:
        beat.close()


def test_a_paused_routines_failure_schedules_no_retry(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    pg_store: Store,
    queue: str,
    processes: list[CeleryProcess],
) -> None:
    register("e2e_app.boom", timedelta(minutes=1), name="boom")
    clock = FakeClock(utc_now().replace(second=0, microsecond=0))
    beat = Scheduler(redis_app(redis_url, postgres_url, task_default_queue=queue), clock=clock)
    try:
        beat.tick()
        clock.advance(minutes=1)
        beat.tick()
        [run] = runs_of(pg_store, "boom")
        with pg_store.engine.begin() as conn:  # paused while its run is in flight
            conn.execute(text("UPDATE routines SET paused = true WHERE name = 'boom'"))
        env = environment(redis_url, postgres_url, E2E_QUEUE=queue, E2E_INTERVAL="3600")
        worker_process = start_worker(tmp_path, env, processes)
        wait_until(
            lambda: pg_store.runs.get(run.id).state == "failed",
            timeout=25,
            what="the run to fail",
            logs=[worker_process],
        )
        failed = pg_store.runs.get(run.id)
        assert (failed.retry_at, failed.reason) == (None, "no_retry:paused")
        assert failed.error == "RuntimeError: boom"
        clock.advance(hours=1)
        beat.tick()
        assert len(runs_of(pg_store, "boom")) == 1
    finally:
        beat.close()


# -- retries on an injected clock, outcomes recorded by a real in-thread worker --


def test_a_failing_task_is_retried_after_1_2_4_minutes_across_a_beat_restart(
    postgres_url: str,
    redis_url: str,
    pg_store: Store,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import celery.contrib.testing.tasks  # noqa: F401  (start_worker expects celery.ping)
    from celery.contrib.testing.worker import start_worker as start_thread_worker

    app = redis_app(redis_url, postgres_url, task_default_queue=queue)
    app.conf.update(broker_transport_options={"visibility_timeout": 3600})

    @app.task(name="lifecycle.always_fails")
    def always_fails() -> None:
        raise RuntimeError("still broken")

    register(always_fails, timedelta(hours=1), name="flaky", max_retries=3)
    clock = FakeClock(utc_now().replace(second=0, microsecond=0))
    monkeypatch.setattr(worker, "clock", clock)

    def wait_for_retrying(attempt: int) -> RunRecord:
        def done() -> bool:
            rows = [r for r in runs_of(pg_store, "flaky") if r.attempt == attempt]
            return bool(rows) and rows[0].state in ("retrying", "failed")

        wait_until(done, timeout=20, what=f"attempt {attempt} to fail", logs=[])
        return next(r for r in runs_of(pg_store, "flaky") if r.attempt == attempt)

    beat = Scheduler(app, clock=clock)
    sent_at = []
    with start_thread_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
        try:
            beat.tick()
            clock.advance(hours=1)
            beat.tick()
            sent_at.append(clock.now)
            for attempt, wait in ((1, 1), (2, 2), (3, 4)):
                failed = wait_for_retrying(attempt)
                assert failed.retry_at == clock.now + timedelta(minutes=wait)
                assert failed.error == "RuntimeError: still broken"
                if attempt == 2:
                    beat.close()  # a beat restart: the retry lives in the database
                    beat = Scheduler(app, clock=clock)
                clock.advance(minutes=wait, seconds=-1)
                beat.tick()
                assert len(runs_of(pg_store, "flaky")) == attempt, "retried before retry_at"
                clock.advance(seconds=1)
                beat.tick()
                sent_at.append(clock.now)
            last = wait_for_retrying(4)
        finally:
            beat.close()
    rows: list[Any] = runs_of(pg_store, "flaky")
    assert [(r.attempt, r.state) for r in rows] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
        (4, "failed"),
    ]
    assert last.retry_at is None
    assert {r.idempotency_key for r in rows} == {rows[0].idempotency_key}
    assert [r.created_at - rows[0].created_at for r in rows] == [
        timedelta(0),
        timedelta(minutes=1),
        timedelta(minutes=3),
        timedelta(minutes=7),
    ]
