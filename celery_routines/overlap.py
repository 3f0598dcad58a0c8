"""Overlap policies: what a due window does while its routine's previous run
is still open (``skip``, ``queue``, ``overlap``, ``replace``).

The decision per routine is :func:`celery_routines.lifecycle.overlap_action`;
this module carries it out for one tick's batch with one indexed query.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from .control import Revoker
from .lifecycle import OVERLAP, QUEUE_RECHECK, overlap_action
from .store import NewRun, Store
from .store.records import OpenRun

if TYPE_CHECKING:
    from .tick import TickReport, _Prepared

logger = logging.getLogger("celery_routines.beat")


def in_progress(runs: Sequence[OpenRun], planned: set[str], now: datetime) -> list[OpenRun]:
    """The open runs that hold a routine back.

    A pending row is ours or an orphan being re-sent, not a run in progress; a
    run past its deadline is lost, whether or not the sweep has said so yet; a
    run of a window planned again is that window's own row (a conflict the
    unique key settles), not an overlap.
    """
    return [
        run
        for run in runs
        if run.state != "pending"
        and run.idempotency_key not in planned
        and (run.deadline_at is None or run.deadline_at > now)
    ]


def apply_overlap(
    store: Store, holder: str, prepared: list[_Prepared], now: datetime, report: TickReport
) -> list[_Prepared]:
    """Decide each due window against its routine's open runs. Returns the
    routines that go ahead; those queued behind an open run stay due, held by
    this beat for a short recheck delay so the tick does not spin on them."""
    sending = [item for item in prepared if item.sends]
    if not sending:
        return prepared
    found = store.runs.open_runs([item.record.id for item in sending])
    queued: list[_Prepared] = []
    for item in sending:
        planned = {run.idempotency_key for run in item.sends}
        holding = in_progress(found.get(item.record.id, []), planned, now)
        action = overlap_action(item.record.overlap, len(holding))
        described = ", ".join(f"{run.idempotency_key} ({run.state})" for run in holding)
        if action == "skip":
            row = overlap_skip_row(item)
            item.skips.append(row)
            # Said in the tick's one line for the row, once it is written.
            item.skip_notes[row.id] = f"previous run still open: {described}"
            item.sends = []
        elif action == "queue":
            queued.append(item)
            report.queued += 1
            logger.info(
                "queued %s: previous run still open: %s; looking again in %.0f s",
                item.sends[0].idempotency_key,
                described,
                QUEUE_RECHECK.total_seconds(),
            )
        elif action == "replace":
            item.replace = [run.id for run in holding]
        if action == "send" and item.record.overlap == "queue" and len(item.sends) > 1:
            # Queued windows go out one at a time: the next stays due and
            # waits for this one to finish.
            item.next_run_at = item.sends[1].scheduled_for
            item.sends = item.sends[:1]
            logger.info(
                "%s: sending the oldest queued window; the next waits for it", item.record.name
            )
    if queued:
        store.routines.defer([item.record.id for item in queued], holder, now + QUEUE_RECHECK)
    held = {item.record.id for item in queued}
    return [item for item in prepared if item.record.id not in held]


def overlap_skip_row(item: _Prepared) -> NewRun:
    """One ``skipped`` row, reason ``overlap``, for the windows of this tick."""
    first, last = item.sends[0], item.sends[-1]
    key = first.idempotency_key
    if len(item.sends) > 1:
        key += ".." + last.idempotency_key.split("@", 1)[1]
    return NewRun(
        id=str(uuid.uuid4()),
        routine_id=item.record.id,
        idempotency_key=key,
        attempt=1,
        scheduled_for=last.scheduled_for,
        state="skipped",
        reason=OVERLAP,
        skipped_count=len(item.sends),
        skipped_first=first.scheduled_for,
        skipped_last=last.scheduled_for,
    )


def replace_open_runs(
    store: Store, revoker: Revoker, ready: list[_Prepared], now: datetime, report: TickReport
) -> None:
    """Close (``failed``, reason ``replaced``) and revoke with terminate the open
    runs a new window replaces; the row is closed first, so the killed run's
    late report changes nothing."""
    for item in ready:
        if not item.replace or not item.sends:
            continue
        by = item.sends[0].idempotency_key
        replaced = store.runs.mark_replaced(item.replace, by, now)
        if replaced:
            report.replaced += len(replaced)
            revoker.revoke(replaced)
            logger.warning(
                "replaced run(s) %s of %s: revoked (terminate) for the new window %s",
                ", ".join(replaced),
                item.record.name,
                by,
            )
