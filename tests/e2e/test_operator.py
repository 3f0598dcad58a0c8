"""The operator's command against real processes: ``celery -A e2e_app routines``
subprocesses send runs that a real worker executes to success (PostgreSQL,
Redis broker), and a second backfill sends nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from celery_routines.store import Store
from celery_routines.store.models import ROUTINES
from tests.e2e.processes import HERE, CeleryProcess, environment, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


def routines_command(env: dict[str, str], *args: str) -> Any:
    """Run ``celery -A e2e_app routines ... --json`` and return its JSON."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "e2e_app", "routines", *args, "--json"],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_trigger_and_backfill_from_the_command_line_run_on_a_real_worker(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    env = environment(redis_url, postgres_url, E2E_QUEUE=f"operator-{uuid.uuid4().hex[:8]}")
    assert routines_command(env, "migrate")["after"]
    store = Store.from_url(postgres_url)
    with store.engine.begin() as conn:
        conn.execute(
            insert(ROUTINES).values(
                name="words",
                task="e2e_app.sql_inserted",
                cron="0 * * * *",
                timezone="Europe/Rome",
                kwargs=json.dumps({"word": "hello"}),
            )
        )
    worker = CeleryProcess(
        ["worker", "--pool", "solo", "--loglevel", "INFO", "--without-heartbeat",
         "--without-mingle", "--without-gossip"],
        env,
        tmp_path / "worker.log",
    )  # fmt: skip
    try:
        triggered = routines_command(env, "trigger", "words")
        span = ("--from", "2026-01-10T08:00", "--to", "2026-01-10T09:00")
        # Both windows at once: the routine's overlap="skip" would send one.
        backfilled = routines_command(env, "backfill", "words", *span, "--overlap", "overlap")
        assert (triggered["outcome"], backfilled["sent"]) == ("sent", 2)

        def all_succeeded() -> bool:
            runs = routines_command(env, "runs", "words")
            return len(runs) == 3 and {r["state"] for r in runs} == {"succeeded"}

        wait_until(all_succeeded, 60, "the three runs to succeed", [worker])
        again = routines_command(
            env, "backfill", "words", "--from", "2026-01-10T08:00", "--to", "2026-01-10T09:00"
        )
        assert (again["sent"], again["existing"]) == (0, 2)
        keys = sorted(r["idempotency_key"] for r in routines_command(env, "runs", "words"))
        assert keys[:2] == [
            "words@2026-01-10T08:00:00+01:00",
            "words@2026-01-10T09:00:00+01:00",
        ]
        assert keys[2].startswith("words@manual:")
        [listed] = routines_command(env, "list")
        assert listed["last_outcome"] == "succeeded"
    finally:
        worker.stop()
        store.dispose()
