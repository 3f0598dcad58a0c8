"""The quickstart: three routines on the embedded default, no server needed.

Run it (from the repository root):

    pip install -e . && celery --workdir examples -A quickstart worker -B --loglevel=INFO

The store is SQLite (examples/var/routines.db) and the broker is kombu's
filesystem transport (examples/var/broker), so nothing else has to run.
Within a minute the log shows routines being sent and tasks succeeding.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path

from celery import Celery

from celery_routines import register, routine

HERE = Path(__file__).resolve().parent
VAR = Path(os.environ.get("QUICKSTART_VAR", HERE / "var"))
BROKER = VAR / "broker"
BROKER.mkdir(parents=True, exist_ok=True)

app = Celery("quickstart")
app.conf.update(
    broker_url="filesystem://",
    broker_transport_options={
        "data_folder_in": str(BROKER),
        "data_folder_out": str(BROKER),
        "control_folder": str(VAR / "control"),
        "polling_interval": 0.5,
    },
    # Where routines and their runs live; SQLite is the embedded default.
    routines_database_url=f"sqlite:///{VAR / 'routines.db'}",
    beat_scheduler="celery_routines.Scheduler",
    # Beat wakes for the next due instant on its own; this caps how long it
    # may take to notice a routine inserted by another process.
    beat_max_loop_interval=10,
    worker_hijack_root_logger=True,
)

logger = logging.getLogger("quickstart")


@routine("* * * * *", timezone="Europe/Rome", catch_up="latest")
@app.task
def every_minute_in_rome() -> str:
    logger.info("every_minute_in_rome ran")
    return "ok"


@routine(timedelta(seconds=10), overlap="skip")
@app.task
def heartbeat() -> str:
    logger.info("heartbeat ran")
    return "beat"


@app.task
def greet(name: str) -> str:
    logger.info("hello, %s", name)
    return f"hello, {name}"


# A task defined elsewhere can be registered by name, with arguments.
register("quickstart.greet", 15, name="greeter", args=["world"])
