"""Writing the routines declared in code at beat start (and ``celery routines
sync``): the upsert, then what it means for the routines it retired or
brought back.

A retired routine is logged once at WARNING and sent as a ``routine-retired``
event; one brought back gets its next window from now (adoption), and the
windows it missed while retired become one ``skipped`` row (reason
``retired``), as ``resume`` does for a pause.
"""

from __future__ import annotations

import getpass
import logging
import socket
from collections.abc import Sequence
from datetime import datetime

from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.observe.events import Events
from celery_routines.policy.catch_up import SkippedWindows
from celery_routines.policy.decide import skip_row
from celery_routines.policy.routine import Routine
from celery_routines.policy.states import Reason
from celery_routines.registry import InvalidEntry
from celery_routines.schedules.base import count_windows, last_windows
from celery_routines.schedules.parse import schedule_of
from celery_routines.store import Store
from celery_routines.store.declarations import Declared, Revived

logger = logging.getLogger("celery_routines.beat")


def process_user() -> str:
    """``user@host`` of this process: who made a change when nobody says."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in a bare container
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def declare(
    store: Store,
    definitions: Sequence[Routine],
    now: datetime,
    *,
    owner: str,
    stamp: str,
    default_zone: str,
    events: Events | None = None,
    invalid: Sequence[InvalidEntry] = (),
) -> Declared:
    """Write ``definitions`` as ``owner``'s code at declaration stamp ``stamp``;
    each ``invalid`` beat_schedule entry becomes an invalid routine with its
    error (no schedule: beat never fires it, and starts anyway)."""
    names = {d.name for d in definitions}
    broken = [_invalid_columns(exc, task) for exc, task in invalid if exc.routine_name not in names]
    for columns in broken:
        logger.error(
            "%s; stored as an invalid routine, beat starts without it", columns["last_error"]
        )
    declared = store.routines.upsert_definitions(
        [d.columns() for d in definitions] + broken, now, owner=owner, stamp=stamp
    )
    if declared.newer_stamp is not None:
        logger.warning(
            "the routines of %r in the database were written by newer code (declaration stamp "
            "%s, this process's is %s): left as they are; this process fires them as stored",
            owner,
            declared.newer_stamp,
            stamp,
        )
        return declared
    by = f"beat:{process_user()}"
    for name in declared.retired:
        logger.warning(
            "retired %s: no longer declared in the code of %r; it will not fire again "
            "(its open runs finish, its history is kept; declare it again to bring it back, "
            "or `celery routines delete %s`)",
            name,
            owner,
            name,
        )
        store.changes.record(name, "retired", by, now, {"owner": owner, "stamp": stamp})
        if events is not None and hasattr(events, "retired"):
            events.retired(name, since=now, owner=owner)
    for name in declared.resumed:
        logger.warning(
            "%s is declared in the code of %r, which takes over the routine imported paused "
            "(import --disabled): resumed, with the code's definition",
            name,
            owner,
        )
        store.changes.record(
            name, "resumed", by, now, {"owner": owner, "taken_over_from": "import"}
        )
    by_name = {d.name: d for d in definitions}
    for revived in declared.revived:
        if revived.name not in by_name:
            continue  # an invalid entry: it has no schedule to count windows on
        skipped = _missed_while_retired(store, by_name[revived.name], revived, now, default_zone)
        logger.warning(
            "%s is declared again: back in service from now (%d window(s) missed while retired "
            "recorded as skipped)",
            revived.name,
            skipped,
        )
        store.changes.record(revived.name, "revived", by, now, {"owner": owner, "stamp": stamp})
    return declared


def _invalid_columns(exc: InvalidRoutine, task: str | None) -> dict[str, object]:
    return {
        "name": exc.routine_name,
        "task": task or "(unknown)",
        "cron": None,
        "interval_seconds": None,
        "timezone": None,
        "enabled": True,
        "last_error": str(exc),
    }


def _missed_while_retired(
    store: Store, definition: Routine, revived: Revived, now: datetime, default_zone: str
) -> int:
    routine_id, retired_at = revived.id, revived.retired_at
    zone = definition.timezone or default_zone
    try:
        schedule = schedule_of(definition, zone)
        count = count_windows(schedule, retired_at, now)
        if not count:
            return 0
        first = schedule.next_after(retired_at)
        last = (last_windows(schedule, retired_at, now, 1) or [first])[-1]
    except ScheduleError:
        return 0
    summary = SkippedWindows(Reason.RETIRED, count, first, last)
    store.runs.insert_new([skip_row(routine_id, definition.name, zone, summary)], now)
    return count
