"""Issue 5 scenarios 1-4 with real beat processes: many beats, kills, outages."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from celery_routines.store import Store
from tests.faults.cluster import (
    BrokerServer,
    Cluster,
    MariaDBServer,
    all_moved_past,
    check_every_window_once,
    runs_written,
    wait_for,
    wait_seconds,
    wait_until_settled,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


def utc_now_naive() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def wait_for_runs(cluster: Cluster, at_least: int, what: str, timeout: float = 60) -> None:
    wait_for(cluster, lambda: runs_written(cluster) >= at_least, timeout, what)


def wait_for_all_past(cluster: Cluster, instant: datetime, what: str, timeout: float = 60) -> None:
    wait_for(cluster, lambda: all_moved_past(cluster, instant), timeout, what)


def test_three_beats_send_every_window_exactly_once(store_cluster: Cluster) -> None:
    cluster = store_cluster
    cluster.add_interval_routines(150, intervals=(1.0, 2.0, 3.0))
    for label in ("beat-a", "beat-b", "beat-c"):
        cluster.start_beat(label)
    # Six windows a routine on average: about ten seconds of three beats
    # contending for every window (1 s loops), 900 windows in all.
    wait_for_runs(cluster, 150 * 6, "900 windows written by three beats", timeout=90)
    cluster.stop_all()
    figures = check_every_window_once(cluster, until=utc_now_naive())
    assert figures["repeats"] == 0  # nobody was killed: no run published twice
    # 150 inserted by SQL plus the e2e app's own declared routine.
    assert figures["routines"] == 151 and figures["sent"] > 150 * 5


def test_a_killed_beats_claims_are_taken_over_and_nothing_is_lost_or_doubled(
    store_cluster: Cluster,
) -> None:
    cluster = store_cluster
    cluster.add_interval_routines(100, intervals=(1.0, 2.0))
    victim = cluster.start_beat("victim")
    cluster.start_beat("survivor")
    # Both beats up and sharing the routines, a few windows each.
    wait_for(
        cluster,
        # (Should the survivor win every claim, the victim holds none: kill it anyway.)
        lambda: (
            runs_written(cluster) >= 100 * 4
            and ("sent r" in victim.output() or runs_written(cluster) >= 100 * 8)
        ),
        60,
        "both beats sending",
    )
    cluster.kill(victim)  # SIGKILL: its claims stay in the table until they expire
    # Every routine has a window written after the victim's claims expired
    # (lock TTL 4 s): the survivor took over whatever the victim held.
    expired = utc_now_naive() + timedelta(seconds=4.5)
    wait_for_all_past(cluster, expired, "the survivor to take every routine over")
    cluster.stop_all()
    figures = check_every_window_once(cluster, until=utc_now_naive())
    assert figures["repeats"] <= 100  # at most the victim's one unconfirmed batch


def test_the_only_beat_killed_and_restarted_recovers_by_the_catch_up_policy(
    cluster: Cluster,
) -> None:
    cluster.add_interval_routines(20, intervals=(1.0,))
    with cluster.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE routines SET catch_up = 'skip_to_next' WHERE name IN ('r0000', 'r0001')")
        )
    first = cluster.start_beat("first")
    wait_for_all_past(cluster, utc_now_naive() + timedelta(seconds=2), "the first beat's sends")
    cluster.kill(first)
    wait_seconds(cluster, 6)  # the downtime: about six missed windows per routine
    cluster.start_beat("restarted")
    wait_for_all_past(cluster, utc_now_naive() + timedelta(seconds=2), "the restarted beat")
    cluster.stop_all()
    figures = check_every_window_once(cluster, until=utc_now_naive())
    assert figures["skipped"] > 0
    rows = cluster.run_rows()
    skip_rows = [r for r in rows if r.state == "skipped" and r.name.startswith("r")]
    assert {r.name for r in skip_rows} == {"r0000", "r0001"}
    assert all(r.skipped_count >= 3 for r in skip_rows)


def test_postgres_connections_killed_mid_run_beat_reconnects_and_loses_nothing(
    cluster: Cluster,
) -> None:
    cluster.add_interval_routines(50, intervals=(1.0, 2.0))
    beats = [cluster.start_beat("beat-a"), cluster.start_beat("beat-b")]
    wait_for(
        cluster,
        lambda: all("sent r" in beat.output() for beat in beats),
        60,
        "both beats sending",
    )
    database = cluster.database_url.rsplit("/", 1)[1]
    admin = create_engine(
        cluster.database_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT"
    )
    killed = 0
    for _ in range(3):
        with admin.connect() as conn:
            killed += conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = :db AND pid <> pg_backend_pid() "
                    "AND application_name NOT LIKE 'pytest%'"
                ),
                {"db": database},
            ).scalar_one()
        wait_seconds(cluster, 2)
    admin.dispose()
    cluster.store.engine.dispose()  # the test's own pool was cut too
    wait_for_all_past(cluster, utc_now_naive() + timedelta(seconds=2), "the beats to carry on")
    wait_until_settled(cluster)
    cluster.stop_all()
    assert killed > 0
    check_every_window_once(cluster, until=utc_now_naive())
    for beat in beats:
        assert "Traceback" not in beat.output() or "beat tick failed" in beat.output()


def test_mariadb_killed_and_restarted_under_two_beats_recovers_and_doubles_nothing(
    tmp_path: Path, private_mariadb: MariaDBServer, redis_url: str
) -> None:
    """The whole server crashes (SIGKILL) under two running beats and comes
    back on the same data: the beats reconnect by themselves, and every
    window is still sent exactly once."""
    admin = create_engine(private_mariadb.url("mysql"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql("CREATE DATABASE routines_restart")
    admin.dispose()
    store = Store.from_url(private_mariadb.url("routines_restart"))
    store.migrate()
    cluster = Cluster(tmp_path, private_mariadb.url("routines_restart"), redis_url, store)
    try:
        cluster.add_interval_routines(50, intervals=(1.0, 2.0))
        beats = [cluster.start_beat("beat-a"), cluster.start_beat("beat-b")]
        wait_for(
            cluster,
            lambda: all("sent r" in beat.output() for beat in beats),
            60,
            "both beats sending",
        )
        private_mariadb.kill()
        wait_seconds(cluster, 4)  # the beats' ticks fail meanwhile; they must not die
        private_mariadb.start()
        store.engine.dispose()  # the test's own pool was cut too
        back = utc_now_naive() + timedelta(seconds=2)
        wait_for_all_past(cluster, back, "the beats to reconnect and carry on")
        wait_until_settled(cluster)
        cluster.stop_all()
        figures = check_every_window_once(cluster, until=utc_now_naive())
        # A beat cut between publishing and marking sent republishes that
        # same run id once (the worker's claim runs it once): a tick's worth.
        assert figures["repeats"] <= 50
        for beat in beats:
            assert "beat tick failed" in beat.output() or "Traceback" not in beat.output()
    finally:
        cluster.stop_all()
        store.dispose()


@pytest.fixture
def gate_redis(tmp_path):
    """A Redis server of the test's own for the gate, so stopping it hurts nobody else."""
    server = BrokerServer(tmp_path)
    server.start()
    yield server
    server.kill()


def test_redis_gate_stopped_and_restarted_beats_keep_firing_and_log_it_once(
    cluster: Cluster, gate_redis: BrokerServer
) -> None:
    cluster.extra_env["ROUTINES_REDIS_URL"] = gate_redis.url
    cluster.add_interval_routines(60, intervals=(1.0, 2.0))
    beats = [cluster.start_beat("beat-a"), cluster.start_beat("beat-b")]
    wait_for(
        cluster,
        lambda: all("sent r" in beat.output() for beat in beats),
        60,
        "both beats sending",
    )
    gate_redis.kill()
    wait_for(
        cluster,
        lambda: all("idempotency gate degraded" in beat.output() for beat in beats),
        30,
        "both beats to find the gate gone",
    )
    wait_seconds(cluster, 3)  # more ticks without the gate: degraded is said once
    gate_redis.start()
    wait_for(
        cluster,
        lambda: all("idempotency gate restored" in beat.output() for beat in beats),
        30,
        "both beats to find the gate back",
    )
    wait_for_all_past(cluster, utc_now_naive() + timedelta(seconds=2), "the beats to carry on")
    cluster.stop_all()
    check_every_window_once(cluster, until=utc_now_naive())
    for beat in beats:
        output = beat.output()
        assert len(re.findall("idempotency gate degraded", output)) == 1, output[-3000:]
        assert "idempotency gate restored" in output
