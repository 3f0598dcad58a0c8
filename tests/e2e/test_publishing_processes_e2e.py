"""``routines_publish_processes`` in real processes: celery beat forks its
publishing processes, a real worker claims and finishes every run they send,
and no publishing process outlives beat, whether beat stops or is killed
(PostgreSQL store, Redis broker)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from celery_routines.store import Store
from tests.e2e import test_end_to_end
from tests.e2e.processes import CeleryProcess, environment, wait_until
from tests.e2e.test_end_to_end import run_counts, start
from tests.harness import running

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

pg_store = test_end_to_end.pg_store  # the same fixture: a PostgreSQL store


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The parent pid is the 2nd field after the command's closing ")".
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def running_with_publishers(tmp_path: Path, redis_url: str, postgres_url: str, store: Store):
    env = environment(redis_url, postgres_url, E2E_INTERVAL="1", ROUTINES_PUBLISH_PROCESSES="2")
    worker, beat = start(tmp_path, env)
    wait_until(
        lambda: run_counts(store).get(("tick", "succeeded"), 0) >= 3,
        timeout=60,
        what="three runs of 'tick' sent by the publishing processes and finished",
        logs=[worker, beat],
    )
    assert "publish -> send_task in 2 publishing process(es)" in beat.output()
    publishers = children_of(beat.process.pid)
    assert len(publishers) == 2, publishers
    counts = run_counts(store)
    assert not {state for (_, state) in counts} & {"failed", "retrying", "lost"}, counts
    return worker, beat, publishers


def wait_gone(pids: list[int], beat: CeleryProcess) -> None:
    deadline = time.monotonic() + 15
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if running(pid)], beat.output()[-3000:]


def test_beat_stopped_by_sigterm_takes_its_publishing_processes_with_it(
    tmp_path: Path, redis_url: str, postgres_url: str, pg_store: Store
) -> None:
    worker, beat, publishers = running_with_publishers(tmp_path, redis_url, postgres_url, pg_store)
    try:
        os.kill(beat.process.pid, signal.SIGTERM)  # beat alone, as `kill <pid>` does
        assert beat.process.wait(timeout=15) == 0
        wait_gone(publishers, beat)
    finally:
        beat.stop()
        worker.stop()


def test_a_killed_beat_leaves_no_publishing_process_behind(
    tmp_path: Path, redis_url: str, postgres_url: str, pg_store: Store
) -> None:
    worker, beat, publishers = running_with_publishers(tmp_path, redis_url, postgres_url, pg_store)
    try:
        os.kill(beat.process.pid, signal.SIGKILL)
        beat.process.wait(timeout=15)
        # Each reads end-of-file on its pipe once beat's end is gone, and exits.
        wait_gone(publishers, beat)
    finally:
        beat.stop()
        worker.stop()
