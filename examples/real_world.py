"""Three routines as a real (Django-free) project would declare them.

* ``daily-report``: every night at 02:30 Rome time. After downtime it catches
  up on the reports it missed (at most 7), and it has a money ceiling: the
  report calls a paid API and reports what it cost with ``spend()``; once 50
  EUR are spent in a calendar month the routine is suspended until the 1st.
* ``reminder``: 09:00 on weekdays in New York. A reminder that is late is
  useless, so after downtime it fires none of the missed ones
  (``skip_to_next``) and one that would go out more than 10 minutes late is
  skipped (``max_lateness``).
* ``poll-inbox``: every 2 minutes; a poll still running when the next is due
  makes that window a recorded skip (``overlap="skip"``), never a pile-up.

Run it (SQLite and the filesystem broker need no server)::

    celery -A real_world worker -B --loglevel=INFO
    celery -A real_world routines list
    celery -A real_world routines show daily-report
"""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery

from celery_routines import Ceiling, routine, spend

BROKER_FOLDER = os.environ.get("REAL_WORLD_BROKER_FOLDER", "var/broker")

app = Celery("real_world")
app.conf.update(
    broker_url=os.environ.get("CELERY_BROKER_URL", "filesystem://"),
    broker_transport_options={
        "data_folder_in": BROKER_FOLDER,
        "data_folder_out": BROKER_FOLDER,
        "control_folder": os.path.join(BROKER_FOLDER, "control"),
    },
    beat_scheduler="celery_routines.Scheduler",
    routines_database_url=os.environ.get("ROUTINES_DATABASE_URL", "sqlite:///var/routines.db"),
    timezone="Europe/Rome",
)

# What one report costs at the paid API (in a real project: read it from the
# API's response).
REPORT_PRICE_EUR = 1.75


@routine(
    "30 2 * * *",
    name="daily-report",
    timezone="Europe/Rome",
    catch_up="catch_up",
    catch_up_cap=7,
    ceiling=Ceiling(50, per="month", unit="eur"),
    max_retries=3,
)
@app.task
def daily_report() -> str:
    spend(REPORT_PRICE_EUR, unit="eur")
    return "report built"


@routine(
    "0 9 * * 1-5",
    name="reminder",
    timezone="America/New_York",
    catch_up="skip_to_next",
    max_lateness=600,
)
@app.task
def send_reminder() -> str:
    return "reminder sent"


@routine(timedelta(minutes=2), name="poll-inbox", overlap="skip")
@app.task
def poll_inbox() -> int:
    return 0
