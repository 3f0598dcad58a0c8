"""What celery-routines costs a worker per run, against plain Celery, same run.

    python -m benchmarks.worker_cost [--n 10000] [--concurrency 2] [--rounds 1]

A real prefork worker (``celery worker -P prefork``, app ``benchmarks.worker_app``)
drains N no-op task messages already waiting on a Redis queue, once as plain
Celery and once with celery-routines (each message a routine run whose row is
``sent`` in a throwaway PostgreSQL database, as beat leaves it). Prints side
by side: throughput (runs per second from the first body's start to the last
one's end), each run's span from ``task_prerun`` to ``task_postrun`` at p50 and
p99 (celery-routines' claim, the body and its outcome all sit in that span, so
the difference is what it adds per run), and the statements per run counted
in the pool processes by a SQLAlchemy event. ``--rounds 2`` alternates the two
modes twice (the machine is shared: compare figures of one run only).
``--baseline DIR`` adds a third worker per round running the celery-routines
code checked out in DIR (say, the previous release) under this checkout's
``benchmarks/worker_app.py``, for a before/after in the same run. Each
worker also reports the CPU time its pool processes used per run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import Celery

from .common import (
    TASK,
    claim_redis_db,
    clear_redis_db,
    create_database,
    drop_database,
    log,
    redis_client,
    redis_url,
)

ROOT = Path(__file__).resolve().parent.parent
ROUTINE = "noop"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def load_runs(store: Any, n: int, routine: str = ROUTINE) -> list[str]:
    """N ``sent`` run rows of one routine, as beat leaves them."""
    from sqlalchemy import text

    from celery_routines.clock import utc_now
    from celery_routines.store import NewRun

    with store.engine.begin() as conn:
        routine_id = conn.execute(
            text(
                "INSERT INTO routines (name, task, interval_seconds) "
                "VALUES (:n, :t, 3600) RETURNING id"
            ),
            {"n": routine, "t": TASK},
        ).scalar_one()
    now = utc_now()
    ids = [str(uuid.uuid4()) for _ in range(n)]
    runs = [
        NewRun(run_id, routine_id, f"{ROUTINE}@{index}", 1, now - timedelta(seconds=index))
        for index, run_id in enumerate(ids)
    ]
    for start in range(0, n, 5000):
        chunk = runs[start : start + 5000]
        store.runs.insert_new(chunk, now)
        store.runs.mark_sent([run.id for run in chunk], now)
    return ids


def publish(db: int, queue: str, ids: list[str], routine: bool) -> None:
    # Plain Celery's messages carry no routine header: the celery CLI loads
    # celery-routines' command (an entry point), which connects its hooks,
    # and those leave a message without the header alone.
    headers = {"routine": ROUTINE} if routine else {}
    app = Celery("bench_publisher", set_as_current=False)
    app.conf.update(broker_url=redis_url(db), task_default_queue=queue)
    with app.connection_for_write() as connection:
        app.amqp.queues[queue](connection.default_channel).declare()
        producer = app.amqp.Producer(connection, auto_declare=False)
        with producer.batch():
            for run_id in ids:
                app.send_task(
                    TASK,
                    task_id=run_id,
                    producer=producer,
                    add_to_parent=False,
                    headers=headers,
                    queue=queue,
                    retry=False,
                )


def drain(
    mode: str,
    n: int,
    db: int,
    pg_url: str,
    concurrency: int,
    store: Any | None,
    root: Path = ROOT,
) -> dict[str, Any]:
    queue = f"bench-worker-{uuid.uuid4().hex[:8]}"
    timings = f"bench-timings-{uuid.uuid4().hex[:8]}"
    app_dir = worker_app_dir()
    ids = load_runs(store, n) if store is not None else [str(uuid.uuid4()) for _ in range(n)]
    publish(db, queue, ids, routine=store is not None)
    client = redis_client(db)
    env = {
        **os.environ,
        "CELERY_BROKER_URL": redis_url(db),
        "BENCH_QUEUE": queue,
        "BENCH_TIMINGS": timings,
        "BENCH_ROUTINES": "1" if store is not None else "0",
        "ROUTINES_DATABASE_URL": pg_url,
        "PYTHONPATH": os.pathsep.join([str(app_dir), str(root)]),
    }
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "benchmarks.worker_app",
        "worker",
        "-P",
        "prefork",
        "-c",
        str(concurrency),
        "-Q",
        queue,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "warning",
        "-n",
        f"bench-{uuid.uuid4().hex[:6]}@%h",
    ]
    worker = subprocess.Popen(command, env=env, cwd=app_dir, start_new_session=True)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            drained = client.llen(queue) == 0 and client.hlen("unacked") == 0
            if drained and (store is None or succeeded(store) >= n):
                break
            if worker.poll() is not None:
                raise RuntimeError(f"the {mode} worker exited with {worker.returncode}")
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the {mode} worker did not drain {n} messages in 600 s")
    finally:
        worker.send_signal(signal.SIGTERM)  # warm shutdown: running bodies finish
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    spans: list[tuple[float, float]] = []
    statements = 0
    cpu_by_process: dict[int, tuple[float, int]] = {}
    for raw in client.lrange(timings, 0, -1):
        batch = json.loads(raw)
        spans.extend(batch["spans"])
        statements += batch["statements"]
        # (CPU seconds, runs) since each pool process's first run; the last batch has the totals
        cpu, runs = batch["cpu"]
        cpu_by_process[batch["pid"]] = max((cpu, runs), cpu_by_process.get(batch["pid"], (0.0, 0)))
    client.delete(timings, queue)
    client.close()
    if len(spans) < n:
        raise RuntimeError(f"{mode}: only {len(spans)} of {n} runs reported their timing")
    durations = [(end - start) * 1000 for start, end in spans]
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    return {
        "mode": mode,
        "runs": len(spans),
        "per_second": len(spans) / wall,
        "p50_ms": percentile(durations, 0.5),
        "p99_ms": percentile(durations, 0.99),
        "statements_per_run": statements / len(spans),
        "cpu_ms": 1000
        * sum(cpu for cpu, _ in cpu_by_process.values())
        / max(1, sum(runs for _, runs in cpu_by_process.values())),
    }


def worker_app_dir() -> Path:
    """A folder holding only this checkout's ``benchmarks`` package: first on
    a worker's path (and its working directory), it makes every worker,
    the baseline's too, run the same worker app, while ``celery_routines``
    comes from the worker's own checkout next on the path."""
    folder = Path(tempfile.gettempdir()) / f"routines-worker-app-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    link = folder / "benchmarks"
    if not link.exists():
        link.symlink_to(ROOT / "benchmarks", target_is_directory=True)
    return folder


def succeeded(store: Any) -> int:
    from sqlalchemy import text

    with store.engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM routine_runs WHERE state = 'succeeded'")
        ).scalar_one()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--baseline", help="a checkout whose celery-routines to measure too")
    parser.add_argument(
        "--without-fsync",
        action="store_true",
        help="also drain with synchronous_commit=off on the throwaway database: not a"
        " configuration to run (a crash would lose claims), only to show what the"
        " durable commits cost",
    )
    args = parser.parse_args()

    from celery_routines.store import Store

    db = claim_redis_db()
    results: list[dict[str, Any]] = []
    commit_floors: list[float] = []
    in_process: list[tuple[float, float]] = []
    names: list[str] = []
    try:
        for round_number in range(args.rounds):
            modes = [("celery", ROOT), ("routines", ROOT)]
            if args.baseline:
                modes.append(("baseline", Path(args.baseline).resolve()))
            if args.without_fsync:
                modes.append(("no-fsync", ROOT))
            for mode, root in modes:
                name, pg_url = create_database("worker")
                names.append(name)
                store = Store.from_url(pg_url)
                store.migrate()
                if mode == "no-fsync":
                    set_synchronous_commit(name, "off")
                try:
                    log(f"round {round_number + 1}: {mode}, {args.n} runs")
                    if mode == "routines":
                        commit_floors.append(durable_commit_ms(pg_url))
                        in_process.append(hooks_in_process_ms(store, pg_url))
                    results.append(
                        drain(
                            mode,
                            args.n,
                            db,
                            pg_url,
                            args.concurrency,
                            None if mode == "celery" else store,
                            root,
                        )
                    )
                finally:
                    store.dispose()
                    drop_database(name)
                    names.remove(name)
    finally:
        clear_redis_db(db, keep_owner=False)
        for name in names:
            drop_database(name)
    report(results, args, commit_floors, in_process)


def set_synchronous_commit(database: str, value: str) -> None:
    from .common import pg_admin

    admin = pg_admin()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{database}" SET synchronous_commit = {value}')
    admin.dispose()


def durable_commit_ms(pg_url: str, n: int = 400) -> float:
    """p50 of one autocommitted single-row UPDATE, on one psycopg connection,
    no SQLAlchemy: the round trip and WAL flush every durable statement pays
    (the floor under the worker's claim and outcome, one each)."""
    import psycopg

    url = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_commit_floor (id int PRIMARY KEY, n int)")
        conn.execute("INSERT INTO bench_commit_floor VALUES (1, 0)")
        spans = []
        for _ in range(n):
            started = time.perf_counter()
            conn.execute("UPDATE bench_commit_floor SET n = n + 1 WHERE id = %s", (1,))
            spans.append((time.perf_counter() - started) * 1000)
        conn.execute("DROP TABLE bench_commit_floor")
    return percentile(spans, 0.5)


def hooks_in_process_ms(store: Any, pg_url: str, n: int = 500) -> tuple[float, float]:
    """p50 of one run's claim and success through the real hooks, called in
    this process with no worker around them: what celery-routines adds to a
    run when nothing else competes for the 2 cores (no pool sibling, no
    consumer process, no broker traffic); and the CPU time they took per run."""
    from celery_routines.worker import hooks
    from celery_routines.worker.stores import forget_stores

    app = Celery("bench_hooks", set_as_current=False)
    app.conf.routines_database_url = pg_url

    @app.task(name=TASK)
    def noop() -> None:
        return None

    task = app.tasks[TASK]
    hooks.install(task)
    spans = []
    cpu = 0.0
    try:
        for index, run_id in enumerate(load_runs(store, n + 50, routine=f"{ROUTINE}-hooks")):
            task.push_request(id=run_id, hostname="bench", headers={"routine": ROUTINE}, retries=0)
            cpu_started, started = time.thread_time(), time.perf_counter()
            try:
                task.before_start(run_id, (), {})
                hooks._on_success(sender=task, result=None)  # what task_success calls
            finally:
                task.pop_request()
            if index >= 50:  # warm: pooled connection, statements prepared
                spans.append((time.perf_counter() - started) * 1000)
                cpu += time.thread_time() - cpu_started
    finally:
        forget_stores()
    return percentile(spans, 0.5), cpu * 1000 / len(spans)


def report(
    results: list[dict[str, Any]],
    args: argparse.Namespace,
    commit_floors: list[float],
    in_process: list[tuple[float, float]],
) -> None:
    print(
        f"A prefork worker (-c {args.concurrency}) draining {args.n} no-op runs, PostgreSQL store,"
        " Redis broker; span = task_prerun to task_postrun in the pool process"
    )
    print(
        f"  {'':10} {'runs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'stmts/run':>10}"
        f" {'pool CPU ms/run':>16}"
    )
    for result in results:
        print(
            f"  {result['mode']:10} {result['per_second']:9.0f} {result['p50_ms']:8.3f}"
            f" {result['p99_ms']:8.3f} {result['statements_per_run']:10.2f}"
            f" {result['cpu_ms']:16.3f}"
        )
    plain: dict[str, Any] | None = None
    for result in results:
        if result["mode"] == "celery":
            plain = result
            continue
        assert plain is not None
        ratio = result["per_second"] / plain["per_second"]
        print(
            f"  {result['mode']} vs plain Celery (same round): throughput {ratio:.2f}x,"
            f" added p50 {result['p50_ms'] - plain['p50_ms']:.3f} ms,"
            f" added p99 {result['p99_ms'] - plain['p99_ms']:.3f} ms,"
            f" {result['statements_per_run']:.2f} statements per run"
        )
    for round_number, (floor, (hooks_ms, hooks_cpu)) in enumerate(
        zip(commit_floors, in_process, strict=True), start=1
    ):
        print(
            f"  round {round_number}: one durable single-row UPDATE (psycopg, autocommit)"
            f" p50 {floor:.3f} ms; the claim and the outcome are two: {2 * floor:.3f} ms;"
            f" the claim and success hooks in one process, no worker: {hooks_ms:.3f} ms"
            f" ({hooks_cpu:.3f} ms of CPU)"
        )


if __name__ == "__main__":
    main()
