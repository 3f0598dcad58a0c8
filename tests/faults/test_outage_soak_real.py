"""Outage soak: two real beats and two real prefork workers through a
fault-injecting proxy (tests/faults/proxy.py) that resets, stalls and refuses
connections at random for a fault period, then a calm period.

One target sits behind the proxy at a time (the other servers are dialled
directly): PostgreSQL, MariaDB, the Redis broker, or the Redis gate
(``ROUTINES_REDIS_URL``). Sixteen routines every 2 s, inserted by SQL with the
package's defaults for catch-up and overlap (``overlap="skip"``: a run left
``sent`` makes every later window of its routine an overlap skip until
``routines_run_timeout``, an hour by default), plus the e2e app's declared
``tick``. After the calm period the beats stop, the workers drain, and the
test counts:

- windows run twice (two runs of one window that both started, or a body
  that ran twice: every body appends ``ran <run id>`` to a file);
- windows missing without a row (each routine's grid of windows from its
  first to the end, covered by a run row or a skip summary);
- runs left ``sent`` or ``running`` after the drain;
- for each routine, how long after the last fault its first run started
  (at most 10 s);
- the fraction of the fault period's windows that ran, and more figures.

It prints them all (run with ``-s`` to see them; ``scripts/outage_soak.py``
runs every target for the full 180 + 60 s and prints them as a table). With
``ROUTINES_SOAK_FIGURES=<file>`` it also appends them to that file as one
JSON line per target.

Durations: ``ROUTINES_SOAK_FAULT_SECONDS`` (default 30, the suite's share:
the full figures come from ``scripts/outage_soak.py``) and
``ROUTINES_SOAK_CALM_SECONDS`` (default 15, past the 10 s recovery bound);
``ROUTINES_SOAK_PATIENCE`` sets the workers' ``routines_database_patience``
(1: claims hand their deliveries back to the broker during refusals);
``ROUTINES_SOAK_SEED`` fixes the
chaos (default: a fresh seed, printed, so a failure can be replayed).
"""

from __future__ import annotations

import collections
import json
import os
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from celery_routines.store import Store
from tests import services
from tests.faults.cluster import wait_for, wait_seconds
from tests.faults.proxy import FaultProxy
from tests.faults.soak_figures import RECOVERY_SECONDS, tally
from tests.topology.workers import WorkerCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FAULT_SECONDS = float(os.environ.get("ROUTINES_SOAK_FAULT_SECONDS", "30"))
CALM_SECONDS = float(os.environ.get("ROUTINES_SOAK_CALM_SECONDS", "15"))
ROUTINES = 16
INTERVAL = 2.0
# What the workers get, once the beats stop, to finish what was sent.
DRAIN_SECONDS = 8.0

# The statement each target's aimed faults wait for (FaultProxy.chaos): the
# worker's claim, beat's publish, a beat's SET NX of its windows on the gate.
# One cut mid-way is what a fault at a random instant seldom catches.
AIM = {
    "postgresql": (b"UPDATE routine_runs SET ", b"started_at="),
    "mariadb": (b"UPDATE routine_runs SET ", b"started_at="),
    "broker": (b"LPUSH", b"e2e_app.record"),
    # The gate sets a tick's keys in one EVALSHA of a SET NX script.
    "gate": (b"celery_routines:window:",),
}

TARGETS = [
    pytest.param("postgresql", marks=[pytest.mark.postgres, pytest.mark.redis]),
    pytest.param("mariadb", marks=[pytest.mark.mysql, pytest.mark.redis]),
    pytest.param("broker", marks=[pytest.mark.postgres, pytest.mark.redis]),
    pytest.param("gate", marks=[pytest.mark.postgres, pytest.mark.redis]),
]


def utc_now_naive() -> datetime:
    """Naive UTC, as run rows read back through plain SQL."""
    return datetime.now(UTC).replace(tzinfo=None)


def wall_of(monotonic: float) -> datetime:
    """The naive UTC instant a ``time.monotonic()`` reading stands for."""
    return utc_now_naive() - timedelta(seconds=time.monotonic() - monotonic)


def proxied_database_url(url: str, port: int) -> str:
    return make_url(url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


def proxied_redis_url(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))


@dataclass
class Soak:
    target: str
    cluster: WorkerCluster
    proxy: FaultProxy
    body_log: Path


@pytest.fixture(params=TARGETS)
def soak(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, migrated_schema: None
) -> Iterator[Soak]:
    """A worker cluster whose ``request.param`` server is dialled through a
    fault proxy. The test's own store connects directly: what it reads is
    never faulted."""
    target = request.param
    database_url = request.getfixturevalue("mariadb_url" if target == "mariadb" else "postgres_url")
    if target in ("postgresql", "mariadb"):
        parsed = make_url(database_url)
        upstream = (
            parsed.host or "127.0.0.1",
            parsed.port or (3306 if target == "mariadb" else 5432),
        )
    else:
        upstream = (services.REDIS_HOST, services.REDIS_PORT)
    proxy = FaultProxy(*upstream, lifetime=FAULT_SECONDS + CALM_SECONDS + 300).start()
    store = Store.from_url(database_url)
    store.migrate()
    process_database = database_url
    broker = redis_url
    extra_env: dict[str, str] = {}
    if target in ("postgresql", "mariadb"):
        process_database = proxied_database_url(database_url, proxy.port)
    elif target == "broker":
        broker = proxied_redis_url(redis_url, proxy.port)
    else:
        extra_env["ROUTINES_REDIS_URL"] = proxied_redis_url(redis_url, proxy.port)
    if os.environ.get("ROUTINES_SOAK_PATIENCE"):
        # Shorter than the refusals: claims hand their deliveries back.
        extra_env["ROUTINES_DATABASE_PATIENCE"] = os.environ["ROUTINES_SOAK_PATIENCE"]
    cluster = WorkerCluster(tmp_path, process_database, broker, store, extra_env=extra_env)
    try:
        yield Soak(target, cluster, proxy, tmp_path / "bodies.log")
    finally:
        cluster.stop_all()
        proxy.close()
        store.dispose()


def insert_routines(store: Store, body_log: Path) -> None:
    """Interval routines by plain SQL, as an operator would; catch-up and
    overlap left to the package's defaults (Cluster.add_interval_routines
    sets ``overlap="overlap"`` for beat-only tests, which would hide a run
    left open)."""
    rows = [
        {
            "name": f"r{i:04d}",
            "task": "e2e_app.record",
            "interval_seconds": INTERVAL,
            "enabled": True,
            "args": json.dumps([str(body_log)]),
        }
        for i in range(ROUTINES)
    ]
    names = list(rows[0])
    with store.engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO routines ({', '.join(names)}) "
                f"VALUES ({', '.join(':' + n for n in names)})"
            ),
            rows,
        )


RUN_COLUMNS = (
    "t.name, t.interval_seconds, r.id, r.idempotency_key, r.attempt, r.state, r.reason, "
    "r.scheduled_for, r.skipped_count, r.skipped_first, r.skipped_last, r.created_at, "
    "r.sent_at, r.started_at, r.finished_at, r.worker, r.duplicates, r.error"
)


def load_runs(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    f"SELECT {RUN_COLUMNS} FROM routine_runs r "
                    "JOIN routines t ON t.id = r.routine_id ORDER BY r.created_at"
                )
            )
        )


def count_open(store: Store) -> int:
    with store.engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM routine_runs WHERE state IN ('sent', 'running')")
        ).scalar_one()


def routines_started(store: Store) -> int:
    """Routines with at least one run whose body started."""
    with store.engine.connect() as conn:
        return conn.execute(
            text("SELECT count(DISTINCT routine_id) FROM routine_runs WHERE started_at IS NOT NULL")
        ).scalar_one()


def relevant_lines(cluster: WorkerCluster, needles: Sequence[str], limit: int = 80) -> str:
    """The processes' log lines that name any of ``needles`` (run ids,
    routine names), plus their errors, at most ``limit`` of each."""
    named: list[str] = []
    errors: list[str] = []
    for process in cluster.processes:
        for line in process.output().splitlines():
            if not line.startswith("[20"):
                continue  # tracebacks' SQL and parameters: the log line above says it
            if needles and any(needle in line for needle in needles):
                named.append(f"{process.log.name}: {line}")
            elif "ERROR" in line or "WARNING" in line:
                errors.append(f"{process.log.name}: {line}")
    return (
        f"--- log lines naming them ({len(named)}, first {limit}):\n"
        + "\n".join(named[:limit])
        + f"\n--- errors and warnings ({len(errors)}, last {limit}):\n"
        + "\n".join(errors[-limit:])
    )


def last_rows(rows: Sequence[Any], names: set[str]) -> list[str]:
    """Each named routine's last row that is not a skip, and its last skip."""
    last: dict[tuple[str, bool], Any] = {}
    for row in rows:
        if row.name in names:
            last[(row.name, row.state == "skipped")] = row
    return [str(tuple(row)) for _, row in sorted(last.items())]


def offending_rows(rows: Sequence[Any], keep: Any) -> list[str]:
    return [str(tuple(row)) for row in rows if keep(row)]


def test_beats_and_workers_ride_out_an_outage_of_one_server(soak: Soak) -> None:
    cluster, proxy = soak.cluster, soak.proxy
    seed = int(os.environ.get("ROUTINES_SOAK_SEED", "0")) or random.randrange(1, 2**31)
    insert_routines(cluster.store, soak.body_log)
    cluster.start_worker()
    cluster.start_worker()
    cluster.start_beat("beat-a")
    cluster.start_beat("beat-b")
    # Everything up and running through the proxy before the first fault:
    # every routine (and the app's declared one) has had a body start.
    wait_for(
        cluster,
        lambda: routines_started(cluster.store) >= ROUTINES + 1,
        90,
        "every routine to run once before the faults",
    )
    fault_started = time.monotonic()
    proxy.chaos(FAULT_SECONDS, seed, aim=AIM[soak.target])
    wait_for(cluster, lambda: not proxy.chaos_running(), FAULT_SECONDS + 15, "the chaos to end")
    proxy.wait_chaos(5)
    last_fault = proxy.last_fault_end() or fault_started
    wait_seconds(cluster, CALM_SECONDS)
    until = utc_now_naive()
    for process in cluster.processes:
        if process not in cluster.workers:
            process.stop()
    # A bounded drain: what is still open after it stays open (counted).
    drain_until = time.monotonic() + DRAIN_SECONDS
    while count_open(cluster.store) and time.monotonic() < drain_until:
        # Only the workers: a beat stopped by SIGTERM exits 0, which
        # Cluster.assert_alive would take for a death.
        for worker in cluster.workers:
            if worker.process.poll() is not None:
                raise AssertionError(f"{worker.log.name} died:\n{worker.output()[-4000:]}")
        time.sleep(0.2)
    received = cluster.broker_task_ids()
    cluster.stop_all()

    rows = load_runs(cluster.store)
    ran_lines = soak.body_log.read_text().splitlines() if soak.body_log.exists() else []
    fault_end = wall_of(last_fault)
    figures = tally(
        rows,
        ran_lines,
        received,
        fault_start=wall_of(fault_started),
        fault_end=fault_end,
        until=until,
    )
    faults = collections.Counter(fault.kind for fault in proxy.faults)
    summary = {
        "target": soak.target,
        "seed": seed,
        "fault_seconds": FAULT_SECONDS,
        "calm_seconds": CALM_SECONDS,
        "faults": dict(faults),
        "connections_accepted": proxy.connections_accepted,
        "connections_refused": proxy.connections_refused,
        **figures.summary(),
    }
    timeline = "\n".join(
        f"{fault.kind} at +{fault.started - fault_started:.1f} s for "
        f"{fault.ended - fault.started:.1f} s ({fault.detail})"
        for fault in proxy.faults
    )
    print(f"\noutage soak faults:\n{timeline}\noutage soak figures: {json.dumps(summary)}")
    if os.environ.get("ROUTINES_SOAK_FIGURES"):
        with open(os.environ["ROUTINES_SOAK_FIGURES"], "a") as out:
            out.write(json.dumps({**summary, "recovery": figures.recovery_seconds}) + "\n")

    failures: list[str] = []
    needles: list[str] = []
    if figures.run_twice:
        windows = set(figures.run_twice)
        failures.append(
            f"{len(windows)} window(s) run twice:\n"
            + "\n".join(
                offending_rows(
                    rows,
                    lambda r: (
                        f"{r.name} {r.scheduled_for.isoformat()}" in windows
                        and r.state != "skipped"
                    ),
                )
            )
        )
        needles += [r.id for r in rows if f"{r.name} {r.scheduled_for.isoformat()}" in windows]
    if figures.missing:
        failures.append(
            f"{len(figures.missing)} window(s) without a row:\n" + "\n".join(figures.missing[:60])
        )
        # As beat's lines name a window: r0001@2026-12-07T21:17:58+00:00.
        needles += [entry.replace(" ", "@") + "+00:00" for entry in figures.missing]
    if figures.left_open:
        left = set(figures.left_open)
        failures.append(
            f"{len(left)} run(s) left sent/running after a {DRAIN_SECONDS} s drain:\n"
            + "\n".join(offending_rows(rows, lambda r: r.id in left))
        )
        needles += sorted(left)
    if figures.frozen:
        frozen = set(figures.frozen)
        late = {name: figures.recovery_seconds[name] for name in figures.frozen}
        failures.append(
            f"{len(frozen)} routine(s) did not start a run within {RECOVERY_SECONDS} s of the "
            f"last fault (seconds, None = never): {late}\n" + "\n".join(last_rows(rows, frozen))
        )
        needles += [r.id for r in rows if r.name in frozen and r.state in ("sent", "running")]
    if failures:
        raise AssertionError(
            f"outage soak through the {soak.target} proxy (seed {seed}): "
            + json.dumps(figures.summary())
            + "\n\n"
            + "\n\n".join(failures)
            + "\n\n--- faults injected:\n"
            + timeline
            + "\n"
            + relevant_lines(cluster, needles)
        )
