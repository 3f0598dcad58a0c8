"""Issue 29: everything through a real PgBouncer, in transaction and session pooling.

A private PgBouncer (``tests/faults/pgbouncer.py``) in front of the test
PostgreSQL; every process of the test connects through it: the schema is
migrated by ``celery routines migrate``, real beats (three in transaction
pooling) claim and publish hundreds of routines due at one instant, real
workers claim and start each run, the CLI and the panel read and write.
Every message is counted per task id (each worker logs each delivery), every
body run per task id, and every log, PgBouncer's included, must be free of
ERROR lines.

Before issue 29, psycopg 3 prepared the store's statements on the server
after five executions; behind transaction pooling the next transaction met
another server connection: "prepared statement "_pg3_7" does not exist",
hundreds of failed ticks a minute, and runs sent twice.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from celery_routines.store import Store
from tests.e2e.panel_cluster import PanelCluster
from tests.e2e.processes import HERE, CeleryProcess, environment
from tests.faults.cluster import Cluster, count, wait_for, wait_seconds
from tests.faults.pgbouncer import PgBouncer

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

ROUTINES = 300
INTERVAL = 10.0  # every routine on one grid: 300 due at one instant every 10 s
# Every delivery of every task (the 300 routines' and the app's own ``tick``).
RECEIVED = re.compile(r"Task e2e_app\.\w+\[([0-9a-f-]+)\] received")
# What a log may not contain: an error, a traceback, a critical line.
BAD_LINE = re.compile(r"ERROR|CRITICAL|Traceback")
RECORDED = (
    "SELECT count(*) FROM routine_runs r JOIN routines t ON t.id = r.routine_id "
    "WHERE t.task = 'e2e_app.record' AND r.state = 'succeeded'"
)
OPEN_RUNS = "SELECT count(*) FROM routine_runs WHERE state IN ('pending', 'sent', 'running')"


def celery_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "e2e_app", "routines", *args],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def bad_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if BAD_LINE.search(line)]


def start_worker(cluster: Cluster, label: str) -> CeleryProcess:
    worker = CeleryProcess(
        ["worker", "--pool", "prefork", "-c", "2", "--loglevel", "INFO", "-n", f"{label}@%h",
         "--without-heartbeat", "--without-mingle", "--without-gossip"],
        environment(cluster.broker_url, cluster.database_url, **cluster.extra_env),
        cluster.tmp_path / f"{label}.log",
    )  # fmt: skip
    cluster.processes.append(worker)
    return worker


@pytest.mark.parametrize(
    ("pgbouncer", "beats", "workers", "seconds"),
    [(("transaction", 20), 3, 2, 75.0), (("session", 60), 2, 1, 30.0)],
    ids=["transaction_pooling", "session_pooling"],
    indirect=["pgbouncer"],
)
def test_beats_and_workers_through_pgbouncer_send_each_run_once_without_an_error_line(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    pgbouncer: PgBouncer,
    beats: int,
    workers: int,
    seconds: float,
) -> None:
    url = pgbouncer.url(postgres_url)  # an empty database: migrated through PgBouncer
    migrated = celery_cli(environment(redis_url, url), "migrate")
    assert migrated.returncode == 0 and not bad_lines(migrated.stderr), migrated.stderr
    store = Store.from_url(url)
    cluster = Cluster(tmp_path, url, redis_url, store)
    bodies = tmp_path / "bodies.log"
    try:
        cluster.add_interval_routines(
            ROUTINES, intervals=(INTERVAL,), task="e2e_app.record",
            kwargs=json.dumps({"path": str(bodies)}),
        )  # fmt: skip
        for n in range(workers):
            start_worker(cluster, f"worker-{n}")
        beat_processes = [
            cluster.start_beat(f"beat-{n}", ROUTINES_LOCK_TTL="10") for n in range(beats)
        ]
        wait_seconds(cluster, seconds)
        for beat in beat_processes:
            beat.stop()  # SIGTERM: each writes down what it sent and hands its claims back
        wait_for(
            cluster,
            lambda: count(cluster, OPEN_RUNS) == 0,
            90,
            "the workers to finish every run sent",
        )
        cluster.stop_all()
        finished = count(cluster, "SELECT count(*) FROM routine_runs WHERE state = 'succeeded'")
        recorded = count(cluster, RECORDED)
    finally:
        cluster.stop_all()
        store.dispose()

    logs = {p.log.name: p.output() for p in cluster.processes}
    received = Counter(
        task_id for name, text in logs.items() if name.startswith("worker")
        for task_id in RECEIVED.findall(text)
    )  # fmt: skip
    ran = Counter(line.split()[1] for line in bodies.read_text().splitlines())
    errors = {name: bad_lines(text) for name, text in logs.items() if bad_lines(text)}
    figures = {
        "pool mode": pgbouncer.pool_mode,
        "beats": beats,
        "routines": ROUTINES,
        "messages": sum(received.values()),
        "task ids received twice or more": sum(1 for n in received.values() if n > 1),
        "bodies run twice or more": sum(1 for n in ran.values() if n > 1),
        "runs succeeded": finished,
        "error lines": sum(len(lines) for lines in errors.values()),
        "failed ticks": sum(text.count("beat tick failed") for text in logs.values()),
        "pgbouncer errors": len(pgbouncer.errors()),
    }
    print("\npgbouncer figures:", figures)
    assert not errors, {name: lines[:5] for name, lines in errors.items()}
    assert not pgbouncer.errors(), pgbouncer.errors()[:5]
    assert figures["task ids received twice or more"] == 0, figures
    assert figures["bodies run twice or more"] == 0, figures
    # Several bursts of every routine went out, each run once, every one ran.
    assert figures["messages"] >= ROUTINES * 2, figures
    assert figures["messages"] == finished, figures
    assert recorded == len(ran) >= ROUTINES * 2, figures


def test_migrations_cli_and_panel_through_pgbouncer_in_transaction_pooling(
    tmp_path: Path, postgres_url: str, redis_url: str, pgbouncer: PgBouncer
) -> None:
    """The panel cluster (a beat, a worker, ``celery routines web``) on an
    empty database through PgBouncer: the schema is migrated through it,
    the panel's pages and API answer, the CLI reads and writes."""
    url = pgbouncer.url(postgres_url)
    with PanelCluster(tmp_path, url, redis_url) as cluster:
        # No bearer token is configured (the panel serves loopback): a
        # script acts with a page's CSRF token, as tests/e2e scripts do.
        headers = {"X-CSRF-Token": cluster.csrf_token()}

        def call(path: str, method: str = "GET") -> int:
            request = urllib.request.Request(
                f"{cluster.url}{path}", method=method, headers=headers,
                data=b"" if method == "POST" else None,
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=30) as answer:
                answer.read()
                return answer.status

        # Many times each: psycopg prepared a statement at its fifth execution.
        for _ in range(8):
            assert call("/") == 200
            assert call("/api/routines") == 200
            assert call("/api/routines/words/runs") == 200
            assert call("/api/runs") == 200
            assert call("/api/routines/words/pause", "POST") == 200
            assert call("/api/routines/words/resume", "POST") == 200
        cli = [
            ("list",),
            ("show", "words"),
            ("runs",),
            ("add", "through-bouncer", "e2e_app.sql_inserted", "--cron", "*/5 * * * *"),
            ("disable", "through-bouncer"),
            ("enable", "through-bouncer"),
            ("history", "through-bouncer"),
        ]
        # Then one manual run sent to the worker.
        for args in [*cli, ("trigger", "words")]:
            done = celery_cli(cluster.env, *args)
            assert done.returncode == 0, (args, done.stdout, done.stderr)
            assert not bad_lines(done.stdout + done.stderr), (args, done.stderr)
    logs = {p.log.name: p.output() for p in cluster.processes}
    errors = {name: bad_lines(text) for name, text in logs.items() if bad_lines(text)}
    assert not errors, {name: lines[:5] for name, lines in errors.items()}
    assert not pgbouncer.errors(), pgbouncer.errors()[:5]
    assert "sent slow@" in logs["beat.log"], logs["beat.log"][-3000:]
    assert "Task e2e_app.hold[" in logs["worker.log"], logs["worker.log"][-3000:]
    assert "Task e2e_app.sql_inserted[" in logs["worker.log"], logs["worker.log"][-3000:]
