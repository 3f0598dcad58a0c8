"""The app the docker-compose set-up runs: PostgreSQL store, Redis broker.

Settings come from the environment (CELERY_BROKER_URL, ROUTINES_DATABASE_URL,
ROUTINES_REDIS_URL), so the same module runs on a laptop and in compose.
"""

from __future__ import annotations

from datetime import timedelta

from celery import Celery

from celery_routines import routine

app = Celery("production")
app.conf.update(beat_scheduler="celery_routines.Scheduler", timezone="Europe/Rome")


@routine("30 2 * * *", catch_up="skip_to_next")
@app.task
def nightly_report() -> str:
    return "report built"


@routine(timedelta(minutes=5), overlap="skip")
@app.task
def poll_inbox() -> int:
    return 0
