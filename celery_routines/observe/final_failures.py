"""What follows a run's final failure: a notification, and for a routine
with ``pause_after_failures=N`` the pause its Nth consecutive one calls for.

Called where a final failure is decided: the worker recording a failed run
whose retries are spent (``worker/hooks.py``) and beat's lost sweep
(``tick/sweeps.py``). Never raises into its caller: a failure to count or to
notify is logged, the run's own outcome is already written.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery_routines.observe.notify import FINAL_FAILURE, PAUSED, Notifies
from celery_routines.store import Store

logger = logging.getLogger("celery_routines.alerts")

PAUSED_BY = "celery-routines (pause_after_failures)"


def pause_reason(count: int, limit: int, failures: list[tuple[str, str]]) -> str:
    """``paused after 3 consecutive final failures (pause_after_failures=3): k3 (failed), ...``"""
    named = ", ".join(f"{key} ({state})" for key, state in failures)
    more = ", ..." if count > len(failures) else ""
    return (
        f"paused after {count} consecutive final failures "
        f"(pause_after_failures={limit}): {named}{more}"
    )


def after_final_failure(
    store: Store,
    *,
    routine_id: int,
    routine: str,
    pause_after: int | None,
    run_id: str,
    window: datetime | None,
    state: str,
    error: str,
    now: datetime,
    notifier: Notifies | None,
) -> bool:
    """Notify the final failure; pause the routine if it is the Nth in a row.
    True when this call paused it."""
    try:
        if notifier is not None:
            notifier.notify(
                FINAL_FAILURE, routine, window=window, run_id=run_id, state=state, reason=error
            )
        if not pause_after:
            return False
        streak = store.streaks.streak(routine_id)
        if streak.count < pause_after:
            return False
        reason = pause_reason(streak.count, pause_after, streak.failures)
        if not store.streaks.pause(routine_id, reason, now):
            return False  # already paused (by hand, or by another process just now)
        store.changes.record(routine, "paused", PAUSED_BY, now, {"reason": reason})
        logger.warning(
            "routine %s %s; `celery routines resume %s` runs it again", routine, reason, routine
        )
        if notifier is not None:
            notifier.notify(
                PAUSED, routine, run_id=run_id, state="paused", reason=reason,
                failures=streak.count, pause_after_failures=pause_after,
            )  # fmt: skip
        return True
    except Exception:
        logger.exception("could not act on the final failure of run %s of %s", run_id, routine)
        return False
