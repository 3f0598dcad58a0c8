"""``current_run()`` inside task bodies run by real workers in every pool:
beat's scheduled windows, a backfill, a replay and a trigger, each telling
the body its routine, window (UTC and local), attempt, run id and kind."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import insert

from celery_routines.operator.admin import Routines
from celery_routines.store import Store
from celery_routines.store.models import ROUTINES
from tests.e2e.processes import CeleryProcess, environment, wait_until
from tests.harness import runs_of

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

ZONE = "Asia/Kolkata"  # +05:30 all year: local and UTC windows never look alike


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def counted(path: Path, count: int) -> Callable[[], bool]:
    return lambda: len(lines(path)) >= count


@pytest.mark.parametrize("pool", ["prefork", "solo", "threads"])
def test_each_kind_of_run_tells_its_body_the_window_in_every_pool(
    tmp_path: Path, postgres_url: str, redis_url: str, pool: str
) -> None:
    queue = f"current-run-{uuid.uuid4().hex[:8]}"
    env = environment(redis_url, postgres_url, E2E_QUEUE=queue)
    often_log, daily_log = tmp_path / "often.jsonl", tmp_path / "daily.jsonl"
    store = Store.from_url(postgres_url)
    store.migrate()
    with store.engine.begin() as conn:
        table = ROUTINES
        conn.execute(
            insert(table).values(
                name="often",
                task="e2e_app.window_probe",
                interval_seconds=2,
                timezone=ZONE,
                kwargs=json.dumps({"path": str(often_log)}),
            )
        )
        conn.execute(
            insert(table).values(
                name="daily",
                task="e2e_app.window_probe",
                cron="0 6 * * *",
                timezone=ZONE,
                max_retries=0,
                overlap="overlap",
                kwargs=json.dumps({"path": str(daily_log), "fail_on": "2026-01-10"}),
            )
        )
    pool_args = ["--pool", pool] + (["--concurrency", "2"] if pool != "solo" else [])
    worker = CeleryProcess(
        ["worker", *pool_args, "--loglevel", "INFO", "--without-heartbeat",
         "--without-mingle", "--without-gossip"],
        env,
        tmp_path / "worker.log",
    )  # fmt: skip
    beat = CeleryProcess(
        ["beat", "-S", "celery_routines.Scheduler", "--loglevel", "INFO",
         "--schedule", str(tmp_path / "celerybeat-schedule")],
        env,
        tmp_path / "beat.log",
    )  # fmt: skip
    app = Celery("current_run_test", set_as_current=False)
    app.conf.update(
        broker_url=redis_url, routines_database_url=postgres_url, task_default_queue=queue
    )
    routines = Routines(app)
    try:
        backfilled = routines.backfill("daily", "2026-01-09T06:00", "2026-01-10T06:00")
        assert [w.outcome for w in backfilled.windows] == ["sent", "sent"]
        routines.trigger("daily")
        wait_until(counted(daily_log, 3), 60, "the backfill and the trigger", [worker, beat])

        def failed_run() -> str | None:
            done = [r for r in runs_of(store, "daily") if r["state"] == "failed"]
            return done[0]["id"] if done else None

        wait_until(lambda: failed_run() is not None, 30, "the failed window", [worker, beat])
        replayed = routines.replay(str(failed_run()))
        wait_until(counted(daily_log, 4), 60, "the replay", [worker, beat])
        wait_until(counted(often_log, 2), 60, "two scheduled windows", [worker, beat])
    finally:
        routines.close()
        beat.stop()
        worker.stop()

    rows = {r["id"]: r for r in [*runs_of(store, "daily"), *runs_of(store, "often")]}
    store.dispose()

    # Beat's windows: kind scheduled, the row's own window, read in the routine's zone.
    for seen in lines(often_log)[:2]:
        row = rows[seen["run_id"]]
        window = datetime.fromisoformat(seen["window"])
        assert (seen["routine"], seen["kind"], seen["attempt"]) == ("often", "scheduled", 1)
        assert window == row["scheduled_for"].replace(tzinfo=UTC)
        assert window.utcoffset() == timedelta(0)
        assert seen["local_window"].endswith("+05:30") and seen["zone"] == ZONE
        assert row["idempotency_key"] == f"often@{seen['local_window']}"

    by_kind: dict[str, list[dict[str, Any]]] = {}
    for seen in lines(daily_log):
        by_kind.setdefault(seen["kind"], []).append(seen)
    assert sorted(by_kind) == ["backfill", "replay", "trigger"]
    # The backfill's windows are the old days, not the day it was sent on.
    assert sorted((s["window"], s["local_window"], s["attempt"]) for s in by_kind["backfill"]) == [
        ("2026-01-09T00:30:00+00:00", "2026-01-09T06:00:00+05:30", 1),
        ("2026-01-10T00:30:00+00:00", "2026-01-10T06:00:00+05:30", 1),
    ]
    [replay] = by_kind["replay"]
    assert (replay["window"], replay["attempt"], replay["run_id"]) == (
        "2026-01-10T00:30:00+00:00",
        2,
        replayed.run_id,
    )
    [trigger] = by_kind["trigger"]
    trigger_row = rows[trigger["run_id"]]
    assert trigger_row["idempotency_key"].startswith("daily@manual:")
    assert datetime.fromisoformat(trigger["window"]) == trigger_row["scheduled_for"].replace(
        tzinfo=UTC
    )
    for seen in lines(daily_log):
        assert rows[seen["run_id"]]["routine_id"] == trigger_row["routine_id"]
