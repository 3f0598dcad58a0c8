"""Notifications and pause_after_failures with real beat and worker
processes (PostgreSQL, Redis broker) and a local HTTP receiver."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import insert

from celery_routines.operator.admin import Routines
from celery_routines.store import Store
from celery_routines.store.models import ROUTINES
from tests.e2e.processes import CeleryProcess, environment, wait_until
from tests.faults.cluster import free_port
from tests.harness import runs_of
from tests.integrations.receiver import JsonReceiver

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

PANEL = "https://ops.example.com/routines"


def start(tmp_path: Path, env: dict[str, str]) -> list[CeleryProcess]:
    worker = CeleryProcess(
        ["worker", "--pool", "solo", "--loglevel", "INFO", "--without-heartbeat",
         "--without-mingle", "--without-gossip"],
        env,
        tmp_path / "worker.log",
    )  # fmt: skip
    beat = CeleryProcess(
        ["beat", "-S", "celery_routines.Scheduler", "--loglevel", "INFO", "--max-interval", "1",
         "--schedule", str(tmp_path / "celerybeat-schedule")],
        env,
        tmp_path / "beat.log",
    )  # fmt: skip
    return [worker, beat]


def add(store: Store, **columns: object) -> None:
    with store.engine.begin() as conn:
        conn.execute(insert(ROUTINES).values(**columns))


def test_final_failures_pause_the_routine_and_a_person_is_told(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    receiver = JsonReceiver(fail_first=2)  # the first two posts are refused: retried
    env = environment(
        redis_url, postgres_url, E2E_QUEUE=f"alerts-{uuid.uuid4().hex[:8]}",
        ROUTINES_NOTIFY_ALLOWED_HOSTS="127.0.0.1", ROUTINES_NOTIFY_URL=receiver.url,
        ROUTINES_PANEL_URL=PANEL,
    )  # fmt: skip
    store = Store.from_url(postgres_url)
    store.migrate()
    now = datetime.now(UTC)
    add(store, name="flaky", task="e2e_app.boom", interval_seconds=1, max_retries=0,
        overlap="overlap", pause_after_failures=3)  # fmt: skip
    add(store, name="broken", task="e2e_app.legacy", cron="99 * * * *")
    add(store, name="behind", task="e2e_app.legacy", interval_seconds=60,
        catch_up="skip_to_next", next_run_at=now - timedelta(hours=1))  # fmt: skip
    processes = start(tmp_path, env)
    try:
        wait_until(lambda: receiver.received("paused"), 60, "the automatic pause", processes)
        wait_until(lambda: receiver.received("invalid") and receiver.received("dropped_windows"),
                   30, "the invalid routine and the dropped windows", processes)  # fmt: skip
    finally:
        for process in processes:
            process.stop()
        receiver.close()

    [paused] = receiver.received("paused")
    failures = [b for b in receiver.received("final_failure") if b["routine"] == "flaky"]
    assert len(failures) >= 3
    first = failures[0]
    assert (first["state"], first["reason"], first["panel_url"]) == (
        "failed", "RuntimeError: boom", f"{PANEL}/routines/flaky",
    )  # fmt: skip
    assert first["run_id"] in {r["id"] for r in runs_of(store, "flaky")}
    assert paused["reason"].startswith(
        "paused after 3 consecutive final failures (pause_after_failures=3): flaky@"
    )
    record = store.routines.by_name("flaky")
    assert record.paused and record.paused_reason == paused["reason"]
    # show (and the API, which returns the same definition) says why.
    routines = Routines(Celery("alerts", set_as_current=False, broker="memory://"),
                        store=store)  # fmt: skip
    assert routines.show("flaky").definition["paused_reason"] == paused["reason"]
    routines.resume("flaky")
    assert routines.show("flaky").definition["paused_reason"] is None
    [invalid] = receiver.received("invalid")
    assert invalid["routine"] == "broken" and "99" in invalid["reason"]
    [dropped] = receiver.received("dropped_windows")
    assert (dropped["routine"], dropped["reason"]) == ("behind", "skip_to_next")
    assert dropped["details"]["count"] >= 59
    assert receiver.refused == 2  # refused, retried, delivered: nothing lost
    print(f"\nnotifications: {json.dumps([b['event'] for b in receiver.received()])}")
    store.dispose()


def test_a_broken_endpoint_never_holds_beat_or_the_worker_back_and_is_said_once(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens
    env = environment(
        redis_url, postgres_url, E2E_QUEUE=f"alerts-{uuid.uuid4().hex[:8]}",
        ROUTINES_NOTIFY_ALLOWED_HOSTS="127.0.0.1", ROUTINES_NOTIFY_URL=closed,
    )  # fmt: skip
    store = Store.from_url(postgres_url)
    store.migrate()
    add(store, name="flaky", task="e2e_app.boom", interval_seconds=1, max_retries=0,
        overlap="overlap")  # fmt: skip
    processes = start(tmp_path, env)
    worker = processes[0]
    try:

        def failed_runs() -> int:
            return sum(r["state"] == "failed" for r in runs_of(store, "flaky"))

        wait_until(lambda: failed_runs() >= 8, 60, "eight failed runs", processes)
    finally:
        for process in processes:
            process.stop()
    log = worker.output()
    assert log.count("could not post a notification") == 1, log[-3000:]
    print(f"\nbroken endpoint: {failed_runs()} final failures, "
          f"{log.count('could not post a notification')} warning line")  # fmt: skip
    store.dispose()


def test_a_routines_own_notify_url_gets_its_notifications_from_beat_and_the_worker(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    default, own = JsonReceiver(), JsonReceiver()
    env = environment(
        redis_url, postgres_url, E2E_QUEUE=f"alerts-{uuid.uuid4().hex[:8]}",
        ROUTINES_NOTIFY_ALLOWED_HOSTS="127.0.0.1", ROUTINES_NOTIFY_URL=default.url,
    )  # fmt: skip
    store = Store.from_url(postgres_url)
    store.migrate()
    now = datetime.now(UTC)
    add(store, name="flaky", task="e2e_app.boom", interval_seconds=1, max_retries=0,
        overlap="overlap", pause_after_failures=2, notify_url=own.url)  # fmt: skip
    add(store, name="behind", task="e2e_app.legacy", interval_seconds=60,
        catch_up="skip_to_next", next_run_at=now - timedelta(hours=1))  # fmt: skip
    processes = start(tmp_path, env)
    try:
        wait_until(lambda: own.received("paused") and default.received("dropped_windows"),
                   60, "the pause at the own URL, the dropped windows at the setting's",
                   processes)  # fmt: skip
    finally:
        for process in processes:
            process.stop()
        default.close()
        own.close()
    assert {b["routine"] for b in own.received()} == {"flaky"}
    assert len(own.received("final_failure")) >= 2  # posted by the worker
    assert "flaky" not in {b["routine"] for b in default.received()}
    assert [b["routine"] for b in default.received("dropped_windows")] == ["behind"]  # by beat
    print(f"\nown url: {json.dumps([b['event'] for b in own.received()])}; "
          f"setting: {json.dumps([b['event'] for b in default.received()])}")  # fmt: skip
    store.dispose()
