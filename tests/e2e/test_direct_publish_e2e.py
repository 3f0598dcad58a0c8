"""``routines_publish = "direct"`` in real processes: celery beat publishes
with the direct path and a real worker claims and finishes every run
(SQLite store, Redis broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_routines.store import Store
from tests.e2e.processes import environment, wait_until
from tests.e2e.test_end_to_end import run_counts, start

pytestmark = pytest.mark.e2e


@pytest.mark.redis
def test_beat_publishing_directly_delivers_runs_a_worker_claims(
    tmp_path: Path, redis_url: str
) -> None:
    database_url = f"sqlite:///{tmp_path / 'routines.db'}"
    env = environment(redis_url, database_url, E2E_INTERVAL="1", ROUTINES_PUBLISH="direct")
    processes = start(tmp_path, env)
    store = Store.from_url(database_url)
    try:
        wait_until(
            lambda: run_counts(store).get(("tick", "succeeded"), 0) >= 3,
            timeout=60,
            what="three runs of 'tick' published directly and finished by the worker",
            logs=list(processes),
        )
        assert "publish -> direct" in processes[1].output()
        counts = run_counts(store)
        assert not {state for (_, state) in counts} & {"failed", "retrying", "lost"}, counts
    finally:
        for process in processes:
            process.stop()
        store.dispose()
