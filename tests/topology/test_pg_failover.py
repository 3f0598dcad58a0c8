"""Issue 36, item 1: a PostgreSQL failover under load.

A private primary and a standby streaming from it (tests/topology/pg_standby.py,
``pg_basebackup`` on this machine), synchronous replication. Two real beats
and a real worker reach whichever is the primary through one libpq
multi-host URL (``host=a,b``, ``target_session_attrs=read-write``). Twenty
routines fire every second; then the standby falls behind (cut off from the
primary for two seconds: the hard case), the primary is stopped hard
(``pg_ctl stop -m immediate``) and, 20 s later (a failover manager's
detection time, shortened), the standby promoted.

Counted from the worker's side (each body writes its routine and window):
windows whose body ran twice, windows whose body never ran, runs left
``sent`` once the run timeout has passed. All three must be 0. Measured: how
long after the promotion the first run is sent; it must be within beat's
database back-off cap (``DATABASE_BACKOFF_CAP``): with the general back-off
(doubling to 30 s) it came 11.8 s after the promotion.

With asynchronous replication the same failover loses what the primary
committed in the span the standby lacked: those windows are fired again by
the beats on the new primary, under new run ids, and their bodies run twice
(docs/production-topology.md). That is the guard this test pins: set
``SYNCHRONOUS = False`` and it fails, with about two seconds of windows
(about 40 here) counted twice.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from celery_routines.store import Store
from celery_routines.tick.backoff import DATABASE_BACKOFF_CAP
from tests import services
from tests.faults.cluster import count, wait_for
from tests.topology import pg_standby
from tests.topology.pg_standby import PrimaryAndStandby
from tests.topology.workers import WorkerCluster

pytestmark = [pytest.mark.postgres, pytest.mark.e2e, pytest.mark.slow]

SYNCHRONOUS = True  # the guard: asynchronous replication fires the lost span twice
ROUTINES = 20
LAG = 2.0  # seconds the standby is behind when the primary stops
# Seconds without a primary: from the primary's stop to the standby's
# promotion (a failover manager's detection time, much shortened).
GAP = 20.0
# Beat's longest sleep caps its back-off too; Celery's default is 300 s (the
# fault tests' 1 s would hide the back-off).
MAX_INTERVAL = 300
RUN_TIMEOUT = 10
OPEN = ("pending", "sent", "running", "retrying")


@pytest.fixture
def servers() -> Iterator[PrimaryAndStandby]:
    why = pg_standby.unavailable()
    if why:
        services.unavailable("a private PostgreSQL primary and standby", why)
    pair = PrimaryAndStandby(synchronous=SYNCHRONOUS)
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()


def utc_now_naive() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def ask(cluster: WorkerCluster, sql: str, **params: object) -> int | None:
    """``count`` on the primary, or None while there is none."""
    try:
        return count(cluster, sql, **params)
    except OperationalError:
        return None


def succeeded(cluster: WorkerCluster) -> int:
    return ask(cluster, "SELECT count(*) FROM routine_runs WHERE state = 'succeeded'") or 0


def open_runs(cluster: WorkerCluster, until: datetime) -> int | None:
    return ask(
        cluster,
        "SELECT count(*) FROM routine_runs r JOIN routines t ON t.id = r.routine_id "
        "WHERE t.name LIKE 'r%' AND scheduled_for <= :until AND r.state IN ("
        + ", ".join(f"'{state}'" for state in OPEN)
        + ")",
        until=until,
    )


def first_send_after(cluster: WorkerCluster, promoted: float, since: datetime) -> float:
    """Seconds from the promotion until a run written after it is sent
    (polled every 50 ms on the new primary)."""
    deadline = promoted + 60
    while time.monotonic() < deadline:
        cluster.assert_alive()
        sent = ask(
            cluster,
            "SELECT count(*) FROM routine_runs WHERE created_at >= :since "
            "AND state IN ('sent', 'running', 'succeeded')",
            since=since,
        )
        if sent:
            return time.monotonic() - promoted
        time.sleep(0.05)
    raise AssertionError("nothing was sent in the 60 s after the promotion")


def observed(cluster: WorkerCluster, bodies_log: Path) -> tuple[list, list[dict]]:
    """The inserted routines' run rows, and what each body wrote."""
    rows = [row for row in cluster.run_rows() if row.name.startswith("r")]
    text = bodies_log.read_text() if bodies_log.exists() else ""
    return rows, [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def tally(rows: list, bodies: list[dict], until: datetime) -> dict[str, int]:
    """Windows up to ``until`` whose body never ran, windows whose body ran
    twice (each body wrote its routine and window: a run the new primary
    does not know is counted too), and runs still ``sent``."""
    ran: Counter[tuple[str, datetime]] = Counter(
        (body["routine"], datetime.fromisoformat(body["window"]).replace(tzinfo=None))
        for body in bodies
    )
    first: dict[str, datetime] = {}
    step: dict[str, timedelta] = {}
    for row in rows:
        first[row.name] = min(first.get(row.name, row.scheduled_for), row.scheduled_for)
        step[row.name] = timedelta(seconds=row.interval_seconds)
    lost = windows = 0
    for name, instant in first.items():
        while instant <= until:
            windows += 1
            lost += ran[name, instant] == 0
            instant += step[name]
    return {
        "windows": windows,
        "fired twice": sum(1 for (name, _), runs in ran.items() if name in first and runs > 1),
        "lost": lost,
        "left sent": sum(1 for row in rows if row.state == "sent" and row.scheduled_for <= until),
    }


def test_a_failover_to_a_synchronous_standby_fires_every_window_once(
    tmp_path: Path, redis_url: str, servers: PrimaryAndStandby
) -> None:
    url = servers.url()
    store = Store.from_url(url)
    store.migrate()
    bodies_log = tmp_path / "bodies.jsonl"
    cluster = WorkerCluster(tmp_path, url, redis_url, store)
    try:
        cluster.add_interval_routines(
            ROUTINES,
            (1.0,),
            task="e2e_app.window_probe",
            kwargs=json.dumps({"path": str(bodies_log)}),
            # A run the worker could not claim while there was no primary
            # stays `sent`: lost after this many seconds and retried (the
            # body fails closed: it never ran), in 1 s.
            run_timeout=RUN_TIMEOUT,
            retry_base_seconds=1,
            # Every window of the outage is replayed (25 by default; older
            # ones would be one `skipped` summary row per routine).
            catch_up_cap=1000,
        )
        cluster.start_worker()
        beats = [
            cluster.start_beat(label, max_interval=MAX_INTERVAL) for label in ("beat-a", "beat-b")
        ]
        load = 2 * ROUTINES
        wait_for(cluster, lambda: succeeded(cluster) >= load, 90, "runs done before failing over")

        promoted = servers.fail_over(lag=LAG, gap=GAP)
        first_send = first_send_after(cluster, promoted, utc_now_naive())
        before = succeeded(cluster)
        wait_for(
            cluster,
            lambda: succeeded(cluster) >= before + load,
            90,
            "runs done after the failover",
        )
        # Every window up to here is written by now (beats fire each within
        # a tick); a run the worker could not claim is lost after
        # RUN_TIMEOUT and retried.
        until = utc_now_naive() - timedelta(seconds=3)
        deadline = time.monotonic() + RUN_TIMEOUT + 60
        while time.monotonic() < deadline:
            cluster.assert_alive()
            if (
                open_runs(cluster, until) == 0
                and tally(*observed(cluster, bodies_log), until)["lost"] == 0
            ):
                break
            time.sleep(0.5)
        for beat in beats:
            beat.stop()
        rows, bodies = observed(cluster, bodies_log)
        counts = tally(rows, bodies, until)
        report = {
            **counts,
            "seconds without a primary": LAG + GAP if SYNCHRONOUS else GAP,
            "first send after promotion (s)": round(first_send, 2),
            "states": dict(Counter(row.state for row in rows)),
            "failed ticks": [beat.output().count("beat tick failed") for beat in beats],
        }
        print(f"PostgreSQL failover ({'synchronous' if SYNCHRONOUS else 'asynchronous'}): {report}")
        assert counts["windows"] >= 4 * ROUTINES
        assert (counts["fired twice"], counts["lost"], counts["left sent"]) == (0, 0, 0), report
        # The first tick on the new primary comes within beat's database
        # back-off cap (ERROR_BACKOFF_CAP, 30 s, before: 11.8 s after it).
        assert first_send < DATABASE_BACKOFF_CAP + 2, report
    finally:
        cluster.stop_all()
        store.dispose()
