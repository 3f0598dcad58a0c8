"""Issue 5, scenario 7 with a real ``celery beat`` under libfaketime.

The beat process's clock (wall and monotonic: libfaketime fakes both) is
moved through ``FAKETIME_TIMESTAMP_FILE``, re-read on every call: stepped back
an hour, beat sends nothing (every window is an hour ahead of it), does not
spin and does not die; stepped forward again it catches up by the catch-up
policy. Then jumped an hour ahead: the windows in the jump are a recovery
(25 replayed, the rest in one summary row each). Every window once.

Needs Debian's ``faketime`` package (``apt-get install faketime``); skipped
without it, failed without it under ROUTINES_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.faults.cluster import (
    Cluster,
    all_moved_past,
    check_every_window_once,
    wait_for,
    wait_seconds,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat; the split starts at field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_count(cluster: Cluster) -> int:
    with cluster.store.engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM routine_runs")).scalar_one()


def utc_now_naive() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def catch_up_summaries(cluster: Cluster) -> int:
    """Inserted routines whose missed windows were summarised after a jump."""
    with cluster.store.engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(DISTINCT t.id) FROM routine_runs r "
                "JOIN routines t ON t.id = r.routine_id "
                "WHERE r.reason = 'catch_up_cap' AND t.name LIKE 'r%'"
            )
        ).scalar_one()


def test_a_real_beat_stepped_back_then_jumped_forward_sends_each_window_once(
    cluster: Cluster, libfaketime: Path, tmp_path: Path
) -> None:
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    cluster.add_interval_routines(20, intervals=(1.0, 2.0))
    beat = cluster.start_beat(
        "beat",
        LD_PRELOAD=str(libfaketime),
        FAKETIME_TIMESTAMP_FILE=str(offset),
        FAKETIME_NO_CACHE="1",
    )
    wait_for(cluster, lambda: run_count(cluster) > 40, 60, "beat's first sends")

    offset.write_text("-1h\n")  # NTP stepped the clock back an hour
    wait_seconds(cluster, 1.5)  # a tick under way may finish its sends
    rows_before, cpu_before = run_count(cluster), cpu_seconds(beat.process.pid)
    wait_seconds(cluster, 5)
    assert run_count(cluster) == rows_before  # every window is an hour ahead
    # Asleep, not spinning: a hot loop burns a core (5 s of CPU in 5 s).
    assert cpu_seconds(beat.process.pid) - cpu_before < 1.5

    offset.write_text("+0\n")  # corrected: the windows of those seconds are missed
    corrected = utc_now_naive() + timedelta(seconds=2)
    wait_for(cluster, lambda: all_moved_past(cluster, corrected), 30, "beat to carry on")
    check_every_window_once(cluster, until=utc_now_naive())

    offset.write_text("+1h\n")  # jumped an hour ahead
    # Every routine missed more than its catch_up_cap (25) windows in the jump.
    wait_for(cluster, lambda: catch_up_summaries(cluster) == 20, 30, "the jump's summaries")
    cluster.stop_all()
    figures = check_every_window_once(cluster, until=utc_now_naive())
    assert figures["repeats"] == 0
    output = beat.output()
    assert "beat tick failed" not in output, output[-3000:]
    with cluster.store.engine.connect() as conn:
        summaries = conn.execute(
            text(
                "SELECT t.name, r.reason, r.skipped_count FROM routine_runs r "
                "JOIN routines t ON t.id = r.routine_id "
                "WHERE r.state = 'skipped' AND t.name LIKE 'r%'"
            )
        ).all()
    # Each 1-second routine met about 3600 missed windows: 25 replayed, the
    # rest in one summary row.
    one_second = [s for s in summaries if int(s.name[1:]) % 2 == 0]
    assert len(one_second) == 10, summaries
    assert all(s.reason == "catch_up_cap" and s.skipped_count > 3000 for s in one_second)
