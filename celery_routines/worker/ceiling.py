"""The worker's ceiling check after a run: a ceiling the run reached
suspends its routine until the period turns (decided by
:func:`celery_routines.policy.ceilings.decide_after_run`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from celery_routines.policy.ceilings import (
    decide_after_run,
    parse_ceilings,
)
from celery_routines.store import Store

logger = logging.getLogger("celery_routines.worker")


# ``(routine, until, reason)``: told when the check suspends a routine.
OnSuspend = Callable[[str, datetime, str], None]


def check_after_run(
    store: Store,
    run_id: str,
    now: datetime,
    default_timezone: str,
    on_suspend: OnSuspend | None = None,
) -> None:
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
        if on_suspend is not None:
            on_suspend(run.routine_name, suspension.until, suspension.reason)
