"""Ceilings in the beat tick: what a routine's budget lets its plan send.

The decisions are the pure functions of :mod:`celery_routines.ceilings`; this
module reads the usage they need, carries out a suspension, and logs it.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery_routines.observe.events import Events
from celery_routines.policy.catch_up import FirePlan
from celery_routines.policy.ceilings import (
    decide_after_run,
    decide_before_send,
    limit_plan,
    parse_ceilings,
    plan_suspended,
)
from celery_routines.schedules.base import Schedule
from celery_routines.store import RoutineRecord, Store

logger = logging.getLogger("celery_routines.beat")


def suspended_plan(record: RoutineRecord, schedule: Schedule, now: datetime) -> FirePlan | None:
    """The plan of a routine suspended at ``now``: its windows up to the end of
    the suspension become one ``ceiling`` skip and it resumes by itself."""
    if record.suspended_until is None or record.suspended_until <= now:
        return None
    assert record.next_run_at is not None  # only claimed (scheduled) routines get here
    return plan_suspended(schedule, record.next_run_at, record.suspended_until).as_fire_plan()


def within_budget(
    store: Store,
    record: RoutineRecord,
    schedule: Schedule,
    plan: FirePlan,
    now: datetime,
    timezone: str,
    events: Events | None = None,
) -> FirePlan:
    """Cut ``plan`` to what the routine's ceilings allow (the before-send check),
    suspending it when a ceiling is reached. Raises ScheduleError for a stored
    ceiling that cannot be read (the routine is then marked invalid)."""
    ceilings = parse_ceilings(record.ceiling)
    if not ceilings or not plan.send:
        return plan
    used = store.spend.used_by_ceiling(record.id, ceilings, now, timezone)
    decision = decide_before_send(ceilings, used, now, timezone, wanted=len(plan.send))
    suspension = decision.suspension
    if suspension is not None and store.spend.suspend(
        record.id, suspension.until, suspension.reason, now
    ):
        if events is not None:
            events.suspended(record.name, until=suspension.until, reason=suspension.reason)
        logger.warning(
            "suspended %s after sending %d of %d window(s): %s",
            record.name,
            decision.send,
            len(plan.send),
            suspension.reason,
        )
    return limit_plan(plan, decision, schedule)


def check_after_run(store: Store, run_id: str, now: datetime, default_timezone: str) -> None:
    """The worker's check once a run's spend is recorded: a ceiling the run
    reached suspends the routine until its period turns. A routine without
    a ceiling costs one read."""
    run = store.spend.run_ceiling(run_id)
    if run is None or not run.ceiling:
        return
    ceilings = parse_ceilings(run.ceiling)
    timezone = run.timezone or default_timezone
    used = store.spend.used_by_ceiling(run.routine_id, ceilings, run.created_at, timezone)
    suspension = decide_after_run(ceilings, used, now, timezone, charged_at=run.created_at)
    if suspension is not None and store.spend.suspend(
        run.routine_id, suspension.until, suspension.reason, now
    ):
        logger.warning("suspended %s after run %s: %s", run.routine_name, run_id, suspension.reason)


def retry_blocked_by_ceiling(
    store: Store, record: RoutineRecord, now: datetime, default_timezone: str
) -> str | None:
    """The before-send check for one retry: the reason it may not go out
    (the routine is suspended as the check decides), or None."""
    ceilings = parse_ceilings(record.ceiling)
    if not ceilings:
        return None
    timezone = record.timezone or default_timezone
    used = store.spend.used_by_ceiling(record.id, ceilings, now, timezone)
    decision = decide_before_send(ceilings, used, now, timezone, wanted=1)
    suspension = decision.suspension
    if decision.send and suspension is None:
        return None
    if suspension is not None and store.spend.suspend(
        record.id, suspension.until, suspension.reason, now
    ):
        logger.warning("suspended %s: %s", record.name, suspension.reason)
    return None if decision.send else "over its ceiling"
