"""Issue 18, item 2 with real beats: claims and run deadlines follow the
database's clock, so a beat whose own clock is 10 minutes fast (libfaketime)
neither holds its claims 10 minutes longer nor delays a takeover.

The fast beat is SIGKILLed in the middle of a burst, holding claims on
routines due by every clock; the beat that takes over (on the real clock)
sends them within ``routines_lock_ttl`` plus one loop, each window once.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.cluster import Cluster
from tests.faults.test_shutdown_real import BURST, burst_in_flight, count

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

TTL = 4.0
ONE_LOOP = 1.0  # --max-interval 1


def test_a_fast_beats_claims_expire_on_the_databases_clock(
    cluster: Cluster, libfaketime: Path, tmp_path: Path
) -> None:
    offset = tmp_path / "faketime"
    offset.write_text("+10m\n")
    cluster.extra_env.update(
        LD_PRELOAD=str(libfaketime),
        FAKETIME_TIMESTAMP_FILE=str(offset),
        FAKETIME_NO_CACHE="1",
        E2E_NO_BROKER_HEALTH_CHECK="1",
    )
    fast = burst_in_flight(cluster, ttl=str(TTL))
    cluster.kill(fast)  # mid-tick: its claims and pending rows stay
    killed = time.monotonic()
    for name in ("LD_PRELOAD", "FAKETIME_TIMESTAMP_FILE", "FAKETIME_NO_CACHE"):
        del cluster.extra_env[name]
    held = count(cluster, "SELECT count(*) FROM routines WHERE locked_by IS NOT NULL")
    assert held > 0, "the fast beat held no claim when it was killed"
    assert "s ahead of the database's" in fast.output()  # the skew was measured and said
    cluster.start_beat("on-time", ROUTINES_LOCK_TTL=str(TTL))
    sent = "SELECT count(*) FROM routine_runs r JOIN routines t ON t.id = r.routine_id "
    sent += "WHERE t.name LIKE 'r%' AND r.state = 'sent'"
    while count(cluster, sent) < BURST:
        cluster.assert_alive()
        # Start-up of the new beat (a few seconds here) plus the TTL and a loop.
        assert time.monotonic() - killed < TTL + ONE_LOOP + 20, (
            f"{count(cluster, sent)} of {BURST} sent: the fast beat's claims still hold"
        )
        time.sleep(0.2)
    rows = [r for r in cluster.run_rows() if r.name.startswith("r")]
    windows = Counter((r.name, r.idempotency_key) for r in rows)
    assert len(windows) == BURST and set(windows.values()) == {1}
    assert set(Counter(cluster.broker_task_ids())) >= {r.id for r in rows}
