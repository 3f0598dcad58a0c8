"""Issue 36, item 2: Redis behind Sentinel, failed over twice under load.

Two real beats and a real worker; the broker is kombu's ``sentinel://`` and
the gate ``routines_redis_url = "sentinel://..."`` (one beat names the master
with ``routines_redis_sentinel_master``, the other takes the broker's
``master_name``). Twenty routines fire every second while the group fails
over twice: ``SENTINEL FAILOVER``, then the new master killed. Every window
is sent once, every sent run reaches the worker and its body runs once.

A Redis outage without Sentinel (the gate's server stopped, then back)
degrades to the database's arbitration alone: that is
tests/faults/test_many_beats_real.py::test_redis_gate_stopped_and_restarted_beats_keep_firing_and_log_it_once.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from celery_routines.sending.gate import KEY_PREFIX
from celery_routines.store import Store
from tests.faults.cluster import Cluster, count, wait_for
from tests.topology.sentinel import MASTER_NAME, SentinelGroup, sentinel_installed
from tests.topology.workers import WorkerCluster

pytestmark = [pytest.mark.postgres, pytest.mark.e2e, pytest.mark.slow]

ROUTINES = 20
RUN_TIMEOUT = 12
OPEN = ("pending", "sent", "running", "retrying")


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    sentinel_installed()
    group = SentinelGroup(tmp_path)
    try:
        group.start()
        yield group
    finally:
        group.stop()


def utc_now_naive() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def succeeded(cluster: Cluster) -> int:
    return count(cluster, "SELECT count(*) FROM routine_runs WHERE state = 'succeeded'")


def gate_keys(group: SentinelGroup) -> list[bytes]:
    client = redis.Redis(host="127.0.0.1", port=group.master_port(), db=1)
    try:
        return client.keys(KEY_PREFIX + "*")
    finally:
        client.close()


def open_runs(cluster: Cluster, until: datetime | None = None) -> int:
    """Runs of the inserted routines (``r0000``...; e2e_app's own ``tick``
    retries a failed send after the default 60 s) not finished yet, of
    windows up to ``until`` (naive UTC)."""
    return count(
        cluster,
        "SELECT count(*) FROM routine_runs r JOIN routines t ON t.id = r.routine_id "
        "WHERE t.name LIKE 'r%' AND r.state IN ("
        + ", ".join(f"'{state}'" for state in OPEN)
        + ")"
        + (" AND scheduled_for <= :until" if until else ""),
        until=until,
    )


def windows_once(
    rows: list, received: Counter[str], bodies: Counter[str], until: datetime
) -> dict[str, int]:
    """Every routine's windows form an unbroken grid up to ``until``, and
    each window's body ran exactly once, from a message the worker received.

    A window may take more than one attempt (each its own run row, the same
    window): a send refused while no master was elected is ``failed`` and
    retried; a message the old master acknowledged and then dropped when
    Sentinel made it a replica (asynchronous replication: writes it took
    after the promotion are discarded) leaves its run ``sent`` until its
    ``run_timeout``, then ``lost``, and retried; so does one the worker had
    taken and got again only after its ``run_timeout`` (the worker's claim
    refuses it then). None of those attempts ran a body."""
    by_routine: dict[str, dict[datetime, list]] = {}
    for row in rows:
        by_routine.setdefault(row.name, {}).setdefault(row.scheduled_for, []).append(row)
    tally: Counter[str] = Counter()
    for name, by_window in by_routine.items():
        step = timedelta(seconds=next(iter(by_window.values()))[0].interval_seconds)
        instants = sorted(by_window)
        for earlier, later in itertools.pairwise(instants):
            assert later - earlier == step, f"{name}: a window lost between {earlier} and {later}"
        assert instants[-1] >= until - 3 * step, f"{name}: fell behind, last {instants[-1]}"
        for instant, attempts in by_window.items():
            if instant > until:
                continue  # beats stopped around it: may be unfinished
            ran = [row for row in attempts if bodies[str(row.id)]]
            described = [(r.state, bodies[str(r.id)], received[str(r.id)]) for r in attempts]
            assert len(ran) == 1 and bodies[str(ran[0].id)] == 1, f"{name}@{instant}: {described}"
            assert ran[0].state == "succeeded" and received[str(ran[0].id)] >= 1, described
            for row in attempts:
                if row is ran[0]:
                    continue
                assert row.state in ("failed", "lost"), f"{name}@{instant}: {described}"
                if row.state == "failed":
                    tally["send refused, retried"] += 1
                elif received[str(row.id)]:
                    # Delivered after its run_timeout: the worker's claim
                    # refused it (the run was lost and retried already).
                    tally["delivered late, refused"] += 1
                else:
                    tally["dropped by Redis, retried"] += 1
            tally["delivered twice"] += sum(1 for row in attempts if received[str(row.id)] > 1)
            tally["windows"] += 1
    return dict(tally)


def test_two_sentinel_failovers_under_load_double_and_lose_nothing(
    tmp_path: Path, postgres_url: str, migrated_schema: None, group: SentinelGroup
) -> None:
    store = Store.from_url(postgres_url)
    ran = tmp_path / "ran.txt"
    cluster = WorkerCluster(tmp_path, postgres_url, group.url(0), store)
    cluster.extra_env.update(
        ROUTINES_REDIS_URL=group.url(1),
        E2E_SENTINEL_MASTER=MASTER_NAME,
        ROUTINES_LOCK_TTL="4",
    )
    cluster.restart_on_kombu_close = True  # see KOMBU_SENTINEL_CLOSE
    try:
        cluster.add_interval_routines(
            ROUTINES,
            (1.0,),
            task="e2e_app.record",
            kwargs=json.dumps({"path": str(ran)}),
            # A send that fails while no master is elected (about 2 s after a
            # kill) is a retry of the same window: in 1 s here, 60 s by default.
            retry_base_seconds=1,
            # A message Redis acknowledged and then lost in the failover (see
            # windows_once) leaves its run `sent`: lost after this many
            # seconds without a worker's claim, and retried (3600 by default).
            run_timeout=RUN_TIMEOUT,
        )
        cluster.start_worker()
        beats = [
            cluster.start_beat("beat-a", ROUTINES_REDIS_SENTINEL_MASTER=MASTER_NAME),
            cluster.start_beat("beat-b"),  # the broker's master_name
        ]
        load = 2 * ROUTINES  # two seconds of windows done between steps
        wait_for(cluster, lambda: succeeded(cluster) >= load, 90, "runs done before failing over")
        assert gate_keys(group), "the gate is not used through Sentinel"

        recovery = []
        for fail_over in (group.failover, group.kill_master):
            before = succeeded(cluster)
            took = fail_over()
            started = time.monotonic()
            wait_for(
                cluster,
                lambda before=before: succeeded(cluster) >= before + load,
                90,
                "runs done after the failover",
            )
            recovery.append((round(took, 1), round(time.monotonic() - started, 1)))
            # The gate follows the master: its keys (each lives
            # routines_lock_ttl, 4 s) are written on the one just elected
            # (within a tick or two of the old one turning replica).
            wait_for(cluster, lambda: bool(gate_keys(group)), 10, "the gate on the new master")
        until = utc_now_naive()
        try:
            wait_for(cluster, lambda: open_runs(cluster, until) == 0, 90, "every window done")
        except AssertionError as exc:
            still = [tuple(r) for r in cluster.run_rows() if r.state in OPEN and r.name[0] == "r"]
            raise AssertionError(f"open: {still[:10]}") from exc
        for beat in beats:
            beat.stop()
        wait_for(cluster, lambda: open_runs(cluster) == 0, 60, "the worker to finish the rest")
        received = Counter(cluster.broker_task_ids())
        bodies = Counter(line.split()[1] for line in ran.read_text().splitlines())
        rows = [row for row in cluster.run_rows() if row.name.startswith("r")]
        report = {
            **windows_once(rows, received, bodies, until),
            "failovers (s to agree, s to 40 more runs done)": recovery,
            "states": dict(Counter(row.state for row in rows)),
            "gate degraded": [beat.output().count("idempotency gate degraded") for beat in beats],
            "worker restarted after kombu's close crash": cluster.worker_restarts,
        }
        print(f"Sentinel failovers: {report}")
        assert report["windows"] >= 6 * ROUTINES
    finally:
        cluster.stop_all()
        store.dispose()
