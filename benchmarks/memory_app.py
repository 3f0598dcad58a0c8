"""The app a real ``celery beat`` runs in ``benchmarks.memory``.

    celery -A memory_app beat -S celery_routines.Scheduler
    celery -A memory_app beat            # Celery's own beat

Settings come from the environment (``MEMORY_*``), so the same app serves both
peers. Self-contained: ``benchmarks.memory`` copies it beside the beat, so a
``--baseline`` checkout without it runs it too.
"""

from __future__ import annotations

import os

from celery import Celery

HOT = 10  # as benchmarks.common
DAY = 86_400
TASK = "bench.noop"

app = Celery("bench", broker=os.environ["MEMORY_BROKER_URL"])
app.conf.broker_connection_retry_on_startup = True
if os.environ.get("MEMORY_DATABASE_URL"):
    app.conf.routines_database_url = os.environ["MEMORY_DATABASE_URL"]
    app.conf.routines_redis_url = os.environ["MEMORY_BROKER_URL"]
# Celery's own beat keeps its schedule in the app: the same routines as the
# rows celery-routines reads (HOT every second, the rest once a day).
entries = int(os.environ.get("MEMORY_CELERY_ENTRIES", "0"))
app.conf.beat_schedule = {
    f"bench-{i}": {"task": TASK, "schedule": 1.0 if i < HOT else float(DAY)} for i in range(entries)
}


@app.task(name=TASK)
def noop() -> None:
    return None
