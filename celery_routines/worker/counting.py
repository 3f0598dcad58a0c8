"""What a worker records for beat's run metrics and event consumers, beside
the run row: a refused duplicate delivery and an after-run suspension each
become a row of ``routine_worker_events`` (counted once whichever process
of which worker wrote it), and the suspension also goes out as a
``routine-suspended`` event, as beat's own suspensions do. Never raises into
Celery: a metric is not worth a task."""

from __future__ import annotations

import logging
import threading
from datetime import datetime

from celery import Celery

from celery_routines.clock import utc_now
from celery_routines.observe.events import RoutineEvents
from celery_routines.store import Store
from celery_routines.store.run_metrics import DUPLICATE, SUSPENDED
from celery_routines.worker.stores import store_for

logger = logging.getLogger("celery_routines.worker")

_events: dict[int, RoutineEvents] = {}
_lock = threading.Lock()


def refused(store: Store, run_id: str, now: datetime) -> None:
    """A delivery of ``run_id`` the claim refused."""
    try:
        store.run_metrics.note(run_id, DUPLICATE, now)
    except Exception:
        logger.warning("could not record the refused delivery of run %s", run_id, exc_info=True)


def suspended(
    app: Celery, store: Store, run_id: str, routine: str, until: datetime, reason: str
) -> None:
    """The after-run check of ``run_id`` suspended ``routine``."""
    try:
        store.run_metrics.note(run_id, SUSPENDED, utc_now())
    except Exception:
        logger.warning("could not record the suspension after run %s", run_id, exc_info=True)
    events_for(app).suspended(routine, until=until, reason=reason)


def events_for(app: Celery) -> RoutineEvents:
    """One event sender per app per process (opened at its first event)."""
    with _lock:
        events = _events.get(id(app))
        if events is None or events.app is not app:
            events = _events[id(app)] = RoutineEvents(app, store=store_for(app))
        return events


def forget_all() -> None:
    """In a fresh pool child: the parent's connections are not ours."""
    with _lock:
        _events.clear()
