"""The Celery app the end-to-end tests run in real beat and worker processes.

Configured from the environment: CELERY_BROKER_URL (read by Celery itself),
ROUTINES_DATABASE_URL and ROUTINES_REDIS_URL (read by celery-routines), and
E2E_INTERVAL for the routine's period in seconds.
"""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery

from celery_routines import routine, spend

app = Celery("e2e_app")
app.conf.update(
    beat_max_loop_interval=5,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    # Each test run gets its own queue, so leftovers never decide a result.
    task_default_queue=os.environ.get("E2E_QUEUE", "celery"),
)
if os.environ.get("E2E_NO_BROKER_HEALTH_CHECK"):
    # Under a sped-up libfaketime clock redis-py's periodic health check
    # misfires (see FIELD-NOTES); the stress tests turn it off.
    app.conf.broker_transport_options = {"health_check_interval": 0}
if os.environ.get("E2E_SENTINEL_MASTER"):
    # A sentinel:// broker (tests/topology): kombu's master_name option, which
    # the Redis gate reads too when routines_redis_sentinel_master is unset.
    app.conf.broker_transport_options = {
        **(app.conf.broker_transport_options or {}),
        "master_name": os.environ["E2E_SENTINEL_MASTER"],
    }
if os.environ.get("E2E_SOLAR"):
    # "sunrise <lat> <lon>": a celery.schedules.solar entry (tests/e2e/test_schedule_types.py).
    from celery.schedules import solar

    event, lat, lon = os.environ["E2E_SOLAR"].split()
    app.conf.beat_schedule = {
        "solar-entry": {"task": "e2e_app.legacy", "schedule": solar(event, float(lat), float(lon))}
    }
if os.environ.get("E2E_BEAT_SCHEDULE"):
    # E2E_BEAT_SCHEDULE: the entry's period in seconds ("1" means the default 2 s).
    period = float(os.environ["E2E_BEAT_SCHEDULE"])
    app.conf.beat_schedule = {
        "legacy-entry": {
            "task": "e2e_app.legacy",
            "schedule": timedelta(seconds=period if period != 1 else 2),
        },
    }


@routine(timedelta(seconds=float(os.environ.get("E2E_INTERVAL", "2"))), name="tick")
@app.task
def tick() -> str:
    spend(2, "emails")
    return "ok"


@app.task
def legacy() -> str:
    return "legacy"


@app.task
def sql_inserted(word: str = "") -> str:
    return word


# -- tasks of the run-lifecycle tests (tests/e2e/test_lifecycle.py) ------------


@app.task(bind=True)
def record(self, path: str) -> str:
    """Appends one line per body run, so a test can count them."""
    with open(path, "a") as log:
        log.write(f"ran {self.request.id}\n")
    return "recorded"


@app.task(bind=True)
def hold(self, path: str, release: str, limit: float = 25.0) -> str:
    """A slow task: runs until the file ``release`` exists (at most ``limit`` s)."""
    import time

    with open(path, "a") as log:
        log.write(f"start {self.request.id} {os.getpid()}\n")
    deadline = time.monotonic() + limit
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(path, "a") as log:
        log.write(f"end {self.request.id}\n")
    return "held"


@app.task
def boom() -> None:
    raise RuntimeError("boom")
