"""Building the run rows a plan writes."""

from __future__ import annotations

import uuid

from celery_routines.policy.catch_up import SkippedWindows
from celery_routines.schedules.keys import window_key
from celery_routines.store import NewRun


def skip_row(routine_id: int, name: str, timezone: str, summary: SkippedWindows) -> NewRun:
    """One ``skipped`` row for a summary of windows.

    Its key is the first window's (``name@first``), or ``name@first..last``
    for several, so it never collides with a window that was sent.
    """
    key = window_key(name, summary.first, timezone)
    if summary.count > 1:
        key += ".." + window_key(name, summary.last, timezone).split("@", 1)[1]
    return NewRun(
        id=str(uuid.uuid4()),
        routine_id=routine_id,
        idempotency_key=key,
        attempt=1,
        scheduled_for=summary.last,
        state="skipped",
        reason=summary.reason,
        skipped_count=summary.count,
        skipped_first=summary.first,
        skipped_last=summary.last,
    )
