"""Beat's /livez and /readyz on real beat processes (PostgreSQL, Redis broker):
a tick loop that stalls flips /livez, a store that cannot be reached flips
/readyz, and both come back; the metrics port serves the same probes."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.e2e.processes import CeleryProcess
from tests.faults.cluster import Cluster, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

# --max-interval 1 (the cluster's beats): the limit is 3 x max(1, 5 s).
STALE_AFTER = 15.0


def probe(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    """The status and body of one probe; (0, why) when it got no answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as reply:
            return reply.status, reply.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()
    except (TimeoutError, urllib.error.URLError, ConnectionError) as exc:
        return 0, f"no answer: {exc}"


def wait_status(
    port: int, path: str, status: int, timeout: float, beat: CeleryProcess
) -> tuple[float, str]:
    """Seconds until ``path`` answered ``status``, and its body."""
    start = time.monotonic()
    seen: tuple[int, str] = (0, "never asked")
    while time.monotonic() - start < timeout:
        seen = probe(port, path)
        if seen[0] == status:
            return time.monotonic() - start, seen[1]
        time.sleep(0.5)
    raise AssertionError(
        f"{path} never answered {status} in {timeout} s (last: {seen})\n{beat.output()[-3000:]}"
    )


def start_ready_beat(cluster: Cluster, **env: str) -> tuple[CeleryProcess, int]:
    port = free_port()
    cluster.add_interval_routines(3, (1.0,))
    beat = cluster.start_beat("beat", ROUTINES_HEALTH_PORT=str(port), **env)
    wait_status(port, "/readyz", 200, 60, beat)
    return beat, port


def test_a_stalled_tick_loop_flips_livez_and_a_resumed_one_flips_it_back(
    cluster: Cluster,
) -> None:
    beat, port = start_ready_beat(cluster)
    assert probe(port, "/livez")[0] == 200
    assert probe(port, "/nothing") == (404, "not found; the probes are /livez and /readyz")

    # A tick stuck in a statement that never returns: another session holds
    # the routines table; the probe thread still answers.
    locker = create_engine(cluster.database_url)
    with locker.connect() as conn:
        conn.execute(text("LOCK TABLE routines IN ACCESS EXCLUSIVE MODE"))
        took, body = wait_status(port, "/livez", 503, STALE_AFTER + 20, beat)
        assert "tick loop stuck" in body
        assert took >= STALE_AFTER - 2  # not before the limit (from the last tick)
        assert probe(port, "/readyz")[0] == 200  # the store answers: ready, not alive
        conn.rollback()
    locker.dispose()
    back, _ = wait_status(port, "/livez", 200, 10, beat)
    print(f"\nlivez: 503 {took:.1f} s after the tick loop stalled; 200 {back:.1f} s after release")

    # The whole process stopped (SIGSTOP): nothing answers, which the kubelet
    # counts as a failed probe; a request waiting through the stop is
    # answered when the process goes on, and the loop turns again.
    os.kill(beat.process.pid, signal.SIGSTOP)
    try:
        assert probe(port, "/livez", timeout=2)[0] == 0
        waited: list[tuple[int, str]] = []
        waiter = threading.Thread(target=lambda: waited.append(probe(port, "/livez", 60)))
        waiter.start()
        time.sleep(STALE_AFTER + 1)
    finally:
        os.kill(beat.process.pid, signal.SIGCONT)
    waiter.join(30)
    resumed, _ = wait_status(port, "/livez", 200, 10, beat)
    print(f"SIGSTOP: no answer; the queued probe got {waited}; 200 again {resumed:.1f} s after")
    assert waited and waited[0][0] in (200, 503)
    cluster.assert_alive()


def test_a_store_that_cannot_be_reached_flips_readyz_with_its_reason(
    cluster: Cluster, postgres_databases
) -> None:
    beat, port = start_ready_beat(cluster)
    name = cluster.database_url.rsplit("/", 1)[1]
    admin = postgres_databases.admin
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
        conn.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
            {"n": name},
        )
        conn.commit()
    try:
        took, body = wait_status(port, "/readyz", 503, 20, beat)
        assert body.startswith("store unreachable: OperationalError:")
        assert "\n" not in body
        assert probe(port, "/livez")[0] == 200  # failing ticks still turn the loop
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            conn.commit()
    back, _ = wait_status(port, "/readyz", 200, 30, beat)
    print(f"\nreadyz: 503 {took:.1f} s after the database refused connections ({body[:80]}...);"
          f" 200 {back:.1f} s after it allowed them again")  # fmt: skip


def test_the_metrics_port_serves_the_probes_too(cluster: Cluster) -> None:
    pytest.importorskip("prometheus_client")
    metrics = free_port()
    start_ready_beat(cluster, ROUTINES_METRICS_PORT=str(metrics))
    assert probe(metrics, "/readyz") == (200, "ok")
    assert probe(metrics, "/livez")[0] == 200
    status, body = probe(metrics, "/metrics")
    assert status == 200 and "routines_ticks_total" in body


def test_a_schema_behind_the_code_is_not_ready(tmp_path: Path) -> None:
    from celery_routines.observe.health import BeatHealth, store_checker
    from celery_routines.store import Store
    from celery_routines.store.migrate import HEAD_REVISION

    store = Store.from_url(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    health = BeatHealth(1, store_checker(store, "0099_future"))
    health.tick_finished(ok=True)
    assert health.answer("/readyz") == (
        503,
        f"schema is at {HEAD_REVISION}, this code needs 0099_future",
    )
    store.dispose()
