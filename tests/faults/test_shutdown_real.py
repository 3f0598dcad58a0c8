"""SIGTERM and SIGKILL of a real beat in the middle of a tick (issue 18,
item 3): a burst of 4,000 due routines, the signal sent while the beat's
committed runs are still ``pending`` (written, being published)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from tests.e2e.processes import CeleryProcess
from tests.faults.cluster import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

BURST = 4000


def count(cluster: Cluster, sql: str) -> int:
    with cluster.store.engine.connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def burst_in_flight(cluster: Cluster, ttl: str, publishing_processes: str = "0") -> CeleryProcess:
    """A beat publishing a burst; returned once some of its runs are committed
    and not yet marked sent (mid-tick)."""
    due = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=1)
    cluster.add_interval_routines(BURST, intervals=(3600.0,), next_run_at=due)
    beat = cluster.start_beat(
        "first", ROUTINES_LOCK_TTL=ttl, ROUTINES_PUBLISH_PROCESSES=publishing_processes
    )
    deadline = time.monotonic() + 60
    while count(cluster, "SELECT count(*) FROM routine_runs WHERE state = 'pending'") == 0:
        assert beat.process.poll() is None, beat.output()[-3000:]
        assert time.monotonic() < deadline, "the burst never started"
        time.sleep(0.01)
    return beat


def sent_once(cluster: Cluster, *, repeats_allowed: bool) -> None:
    """Every burst routine has one run, sent, and its id reached the broker."""
    rows = [r for r in cluster.run_rows() if r.name.startswith("r")]
    assert len(rows) == BURST and {r.state for r in rows} == {"sent"}
    published = Counter(cluster.broker_task_ids())
    assert {r.id for r in rows} <= set(published)
    if not repeats_allowed:
        assert max(published.values()) == 1, "a run id was published twice"


def wait_for_all_sent(cluster: Cluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    query = "SELECT count(*) FROM routine_runs WHERE state = 'sent'"
    while count(cluster, query) < BURST:
        cluster.assert_alive()
        assert time.monotonic() < deadline, f"only {count(cluster, query)} of {BURST} sent"
        time.sleep(0.2)


@pytest.mark.parametrize("publishing_processes", ["0", "2"], ids=["in_beat", "two_processes"])
def test_sigterm_mid_tick_publishes_what_it_committed_releases_its_claims_and_exits_0(
    cluster: Cluster, publishing_processes: str
) -> None:
    # With publishing processes the group's SIGTERM reaches them too: each
    # answers the chunk it holds and ends, and the stopping beat sends what
    # is left of what it committed itself.
    beat = burst_in_flight(cluster, ttl="60", publishing_processes=publishing_processes)
    os.killpg(beat.process.pid, signal.SIGTERM)
    told = time.monotonic()
    assert beat.process.wait(timeout=15) == 0, beat.output()[-3000:]
    assert time.monotonic() - told < 8
    cluster.processes.remove(beat)  # ended by itself, with status 0
    assert "told to stop (SIGTERM) during a tick" in beat.output()
    assert count(cluster, "SELECT count(*) FROM routine_runs WHERE state = 'pending'") == 0
    assert count(cluster, "SELECT count(*) FROM routines WHERE locked_by IS NOT NULL") == 0
    # The next beat carries on with the rest of the burst at once (claims of
    # 60 s: nothing waits for one to expire), and nothing goes out twice.
    cluster.start_beat("next", ROUTINES_LOCK_TTL="60")
    wait_for_all_sent(cluster, timeout=30)
    sent_once(cluster, repeats_allowed=False)


def test_sigkill_mid_tick_leaves_its_pending_runs_to_the_next_beat_after_the_ttl(
    cluster: Cluster,
) -> None:
    beat = burst_in_flight(cluster, ttl="4")
    cluster.kill(beat)  # no goodbye: claims and pending rows stay
    cluster.start_beat("next", ROUTINES_LOCK_TTL="4")
    wait_for_all_sent(cluster, timeout=4 + 30)
    # A run published but not marked sent before the kill is published again
    # under the same run id (the worker's claim runs it once).
    sent_once(cluster, repeats_allowed=True)
