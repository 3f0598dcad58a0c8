"""Taking over a routine from a beat that died mid-tick.

A beat that wrote its due window's run row and died before advancing the
routine leaves it due at that window. When the claim expires, the beat that
takes the routine over plans from the same due window; if that plan puts the
window into a skipped summary (a recovery under ``skip_to_next``, ``latest`` or
the catch-up cap), the window would be both written and skipped. This drops it
from the summary; a row still ``pending`` (written, perhaps never sent) goes
out again through the tick's orphan path, with its own run id, so the worker's
claim on the run row makes a repeated delivery harmless.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from celery_routines.policy.catch_up import SkippedWindows
from celery_routines.schedules.keys import window_key
from celery_routines.store import NewRun, RunRecord, Store
from celery_routines.tick.runrows import skip_row

if TYPE_CHECKING:
    from celery_routines.tick.report import _Prepared

logger = logging.getLogger("celery_routines.beat")


def resume_after_written_due_windows(store: Store, ready: list[_Prepared]) -> None:
    """Only routines whose plan skips their due window cost a query (one, batched)."""
    candidates: dict[tuple[int, str, int], _Prepared] = {}
    for item in ready:
        due = item.record.next_run_at
        if any(skip.skipped_first == due for skip in item.skips):
            key = window_key(item.record.name, due, item.timezone)  # type: ignore[arg-type]
            candidates[(item.record.id, key, 1)] = item
    if not candidates:
        return
    for row in store.runs.find_windows(list(candidates)):
        _unskip(candidates[(row.routine_id, row.idempotency_key, row.attempt)], row)


def _unskip(item: _Prepared, row: RunRecord) -> None:
    due = row.scheduled_for
    for index, skip in enumerate(item.skips):
        if skip.skipped_first != due:
            continue
        remaining = (skip.skipped_count or 1) - 1
        if remaining == 0:
            del item.skips[index]
        else:
            assert item.schedule is not None and skip.skipped_last is not None
            summary = SkippedWindows(
                skip.reason or "", remaining, item.schedule.next_after(due), skip.skipped_last
            )
            item.skips[index] = skip_row(item.record.id, item.record.name, item.timezone, summary)
        break
    logger.info(
        "%s was already written (%s) by a beat whose claim expired; not skipping it",
        row.idempotency_key,
        row.state,
    )
    if row.state == "pending":
        item.sends.insert(
            0,
            NewRun(
                id=str(uuid.uuid4()),
                routine_id=row.routine_id,
                idempotency_key=row.idempotency_key,
                attempt=row.attempt,
                scheduled_for=due,
            ),
        )
