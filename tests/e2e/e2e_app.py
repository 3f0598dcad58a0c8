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
if os.environ.get("E2E_BEAT_SCHEDULE"):
    app.conf.beat_schedule = {
        "legacy-entry": {"task": "e2e_app.legacy", "schedule": timedelta(seconds=2)},
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
