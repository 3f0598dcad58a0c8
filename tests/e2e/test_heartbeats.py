"""Heartbeats with real workers (issue 18, item 1): a run is lost when its
worker shows no sign of life for ``run_timeout``, not when its body is long.

Real ``celery beat`` and ``celery worker`` subprocesses on Redis and
PostgreSQL, on the real clock; ``routines_run_timeout`` is a few seconds.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from celery_routines.clock import utc_now
from celery_routines.store import Store
from tests.e2e import test_lifecycle
from tests.e2e.processes import CeleryProcess, environment, wait_until
from tests.e2e.test_lifecycle import lines, runs_of, start_worker
from tests.harness import insert_routine

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

TIMEOUT = 2.0
# Beat's loop (--max-interval 1) plus the lost sweep's own cadence (5 s).
ONE_LOOP = 1.0 + 5.0


pg_store = test_lifecycle.pg_store  # the same fixture: a migrated PostgreSQL store


@pytest.fixture
def processes() -> Iterator[list[CeleryProcess]]:
    started: list[CeleryProcess] = []
    yield started
    for process in started:
        if process.process.poll() is None:
            os.killpg(process.process.pid, signal.SIGCONT)  # a frozen one must hear SIGTERM
        process.stop()


def setup(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    store: Store,
    processes: list[CeleryProcess],
    *,
    limit: float,
    setting: float = TIMEOUT,
    **columns: object,
) -> tuple[dict[str, str], Path, Path, CeleryProcess]:
    """A routine ``slow`` due now whose body runs until ``release`` exists
    (at most ``limit`` s), and a real beat."""
    body_log, release = tmp_path / "body.log", tmp_path / "release"
    env = environment(
        redis_url,
        postgres_url,
        E2E_QUEUE=f"heartbeat-{uuid.uuid4().hex[:8]}",
        E2E_INTERVAL="3600",
        ROUTINES_RUN_TIMEOUT=str(setting),
    )
    insert_routine(
        store,
        "slow",
        task="e2e_app.hold",
        interval_seconds=3600,
        kwargs=json.dumps({"path": str(body_log), "release": str(release), "limit": limit}),
        next_run_at=utc_now().replace(tzinfo=None, microsecond=0),  # due now
        **columns,
    )
    schedule = str(tmp_path / "beat-schedule")
    beat = CeleryProcess(
        ["beat", "-S", "routines", "--loglevel", "INFO", "--max-interval", "1", "-s", schedule],
        env,
        tmp_path / "beat.log",
    )
    processes.append(beat)
    return env, body_log, release, beat


def wait_for_start(body_log: Path, processes: list[CeleryProcess]) -> None:
    wait_until(
        lambda: any(line.startswith("start") for line in lines(body_log)),
        timeout=25,
        what="the slow body to start",
        logs=processes,
    )


def kill_and_wait_for_lost(
    worker: CeleryProcess, processes: list[CeleryProcess], store: Store, beat: CeleryProcess
) -> None:
    """SIGKILL the whole worker (no goodbye); its newest run of ``slow`` must
    be declared lost within TIMEOUT and one beat loop."""
    os.killpg(worker.process.pid, signal.SIGKILL)
    killed = time.monotonic()
    worker.process.wait(timeout=5)
    processes.remove(worker)
    wait_until(
        lambda: runs_of(store, "slow")[-1].state == "lost",
        timeout=TIMEOUT + ONE_LOOP + 10,
        what="beat to declare the run lost",
        logs=[beat],
    )
    assert time.monotonic() - killed <= TIMEOUT + ONE_LOOP + 1.5


@pytest.mark.parametrize("pool", ["prefork", "solo", "threads"])
def test_a_body_running_four_times_the_timeout_is_never_lost_and_runs_once(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    pg_store: Store,
    processes: list[CeleryProcess],
    pool: str,
) -> None:
    env, body_log, _, beat = setup(
        tmp_path, postgres_url, redis_url, pg_store, processes, limit=4 * TIMEOUT, max_retries=2
    )
    start_worker(tmp_path, env, processes, pool=pool, concurrency=1)
    wait_for_start(body_log, processes)
    wait_until(
        lambda: any(line.startswith("end") for line in lines(body_log)),
        timeout=4 * TIMEOUT + 10,
        what="the slow body to end",
        logs=processes,
    )
    wait_until(
        lambda: [r.state for r in runs_of(pg_store, "slow")] == ["succeeded"],
        timeout=10,
        what="the run to be recorded succeeded",
        logs=processes,
    )
    [run] = runs_of(pg_store, "slow")
    assert (run.attempt, run.reason, run.error) == (1, None, None)
    assert [line.split()[0] for line in lines(body_log)] == ["start", "end"]
    assert "declared lost" not in beat.output()


def test_a_sigkilled_workers_run_is_lost_within_the_timeout_and_one_loop(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    pg_store: Store,
    processes: list[CeleryProcess],
) -> None:
    env, body_log, _, beat = setup(
        tmp_path, postgres_url, redis_url, pg_store, processes, limit=60, max_retries=0
    )
    doomed = start_worker(tmp_path, env, processes, pool="prefork", concurrency=1)
    wait_for_start(body_log, processes)
    time.sleep(TIMEOUT)  # a few heartbeats went out
    kill_and_wait_for_lost(doomed, processes, pg_store, beat)
    assert "worker was probably lost" in runs_of(pg_store, "slow")[0].error


def test_a_frozen_worker_is_lost_and_its_late_success_after_sigcont_is_recorded(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    pg_store: Store,
    processes: list[CeleryProcess],
) -> None:
    # One retry, an hour away: the lost run waits in `retrying` (reason lost),
    # where a late success still lands and cancels the retry (see run_outcomes).
    env, body_log, release, beat = setup(
        tmp_path,
        postgres_url,
        redis_url,
        pg_store,
        processes,
        limit=120,
        max_retries=1,
        retry_base_seconds=3600,
    )
    frozen = start_worker(tmp_path, env, processes, pool="prefork", concurrency=1)
    wait_for_start(body_log, processes)
    os.killpg(frozen.process.pid, signal.SIGSTOP)  # the worker and its pool child
    try:
        wait_until(
            lambda: (
                (runs_of(pg_store, "slow")[0].state, runs_of(pg_store, "slow")[0].reason)
                == ("retrying", "lost")
            ),
            timeout=TIMEOUT + ONE_LOOP + 10,
            what="beat to declare the frozen worker's run lost",
            logs=[beat],
        )
        release.touch()
    finally:
        os.killpg(frozen.process.pid, signal.SIGCONT)
    wait_until(
        lambda: runs_of(pg_store, "slow")[0].state == "succeeded",
        timeout=20,
        what="the resumed worker's late success to be recorded",
        logs=processes,
    )
    [run] = runs_of(pg_store, "slow")
    assert (run.attempt, run.retry_at, run.reason) == (1, None, None)
    assert [line.split()[0] for line in lines(body_log)] == ["start", "end"]


def test_a_routines_own_run_timeout_paces_its_heartbeat_and_its_lost_deadline(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    pg_store: Store,
    processes: list[CeleryProcess],
) -> None:
    """``routines_run_timeout`` is an hour; the routine's own ``run_timeout``
    is TIMEOUT. Its body runs 4x that and is never lost (the heartbeat beats
    every third of the routine's value, not of the hour); then a second run's
    worker is SIGKILLed and the run is lost within TIMEOUT and one loop (not
    within the hour)."""
    env, body_log, _, beat = setup(
        tmp_path,
        postgres_url,
        redis_url,
        pg_store,
        processes,
        limit=4 * TIMEOUT,
        setting=3600,
        max_retries=0,
        run_timeout=TIMEOUT,
    )
    worker = start_worker(tmp_path, env, processes, pool="prefork", concurrency=1)
    wait_for_start(body_log, processes)
    wait_until(
        lambda: [r.state for r in runs_of(pg_store, "slow")] == ["succeeded"],
        timeout=4 * TIMEOUT + 15,
        what="the long body to end and be recorded succeeded",
        logs=processes,
    )
    assert "declared lost" not in beat.output()
    # A second window now, whose body outlives its worker.
    with pg_store.engine.begin() as conn:
        conn.execute(
            text("UPDATE routines SET next_run_at = :now, kwargs = :kwargs WHERE name = 'slow'"),
            {
                "now": utc_now().replace(tzinfo=None, microsecond=0),
                "kwargs": json.dumps({"path": str(body_log), "release": "", "limit": 60}),
            },
        )
    wait_until(
        lambda: len([line for line in lines(body_log) if line.startswith("start")]) == 2,
        timeout=25,
        what="the second body to start",
        logs=processes,
    )
    kill_and_wait_for_lost(worker, processes, pg_store, beat)
