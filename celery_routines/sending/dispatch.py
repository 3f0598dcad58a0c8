"""Sending runs outside the beat tick (trigger, replay, backfill).

The same order and the same pieces as the tick (guarantee 5, ``sender.py``):
write the run rows first, with the deadline after which the lost sweep takes
them; let the database's unique ``(routine_id, idempotency_key, attempt)``
decide which are new; publish only those and mark them sent, through the
one :class:`~celery_routines.sending.sender.Sender`. A failed publish is
recorded like beat's own (``retrying`` under the routine's retry policy, or
``failed``). A row that already existed is never sent again from here, which
is what makes a second backfill a no-op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from celery_routines.clock import Clock
from celery_routines.policy.routine_rows import from_columns
from celery_routines.policy.runs import lost_deadline, unstarted_timeout
from celery_routines.policy.states import Reason, RunKind
from celery_routines.sending.publish import Publisher
from celery_routines.sending.sender import MarkSentNow, Outbound, Sender, outgoing_run
from celery_routines.store import NewRun, RoutineRecord, Store


class Outcome(StrEnum):
    """What happened to one run handed to :func:`dispatch`."""

    SENT = "sent"
    # A row for this window and attempt was already stored: nothing sent.
    EXISTS = "exists"
    # Row written, broker refused: the run's reason says the same.
    SEND_FAILED = Reason.SEND_FAILED.value


SENT, EXISTS, SEND_FAILED = Outcome.SENT, Outcome.EXISTS, Outcome.SEND_FAILED


@dataclass(frozen=True)
class Dispatched:
    """What happened to one run handed to :func:`dispatch`."""

    run: NewRun
    outcome: str
    """``sent``, ``exists`` (a row for this window and attempt was already
    stored: nothing sent) or ``send_failed`` (row written, broker refused)."""
    existing_state: str | None = None
    existing_id: str | None = None
    error: str | None = None


def dispatch(
    store: Store,
    publisher: Publisher,
    record: RoutineRecord,
    new_runs: Sequence[NewRun],
    clock: Clock,
    run_timeout: float,
    start_timeout: float | None,
    kind: str = RunKind.SCHEDULED,
) -> list[Dispatched]:
    """Write, send and mark ``new_runs`` of ``record``, oldest first;
    ``kind`` (backfill, replay, trigger) travels in their messages."""
    # Before anything is written: an invalid row sends nothing.
    routine = from_columns(record)
    run_timeout = routine.run_timeout or run_timeout
    now = clock()
    # A row left pending (this process dies before publishing) is found by
    # the lost sweep at its deadline, exactly like one of beat's.
    waits = unstarted_timeout(run_timeout, start_timeout)
    rows = [dataclasses.replace(r, deadline_at=lost_deadline(now, waits)) for r in new_runs]
    inserted = store.runs.insert_new(rows, now)
    existing = {
        (row.idempotency_key, row.attempt): row
        for row in store.runs.find_windows(
            [(r.routine_id, r.idempotency_key, r.attempt) for r in rows if r.id not in inserted]
        )
    }
    fresh = [run for run in rows if run.id in inserted]
    # One send loop with beat's windows and retries (sending/sender.py):
    # batched where the transport allows, and once the broker fails (after
    # its retries) the rest fail at once instead of each waiting out its own.
    outbound = [Outbound(outgoing_run(routine, run, kind=kind), record) for run in fresh]
    done = Sender(store, publisher, clock).send(
        outbound, MarkSentNow(store, run_timeout, start_timeout)
    )
    results: list[Dispatched] = []
    for run in rows:
        if run.id not in inserted:
            # Another writer (beat, an earlier backfill) owns this window.
            row = existing.get((run.idempotency_key, run.attempt))
            results.append(
                Dispatched(
                    run,
                    EXISTS,
                    existing_state=row.state if row else None,
                    existing_id=row.id if row else None,
                )
            )
            continue
        error = done.errors[run.id]
        if error is None:
            results.append(Dispatched(run, SENT))
        else:
            results.append(Dispatched(run, SEND_FAILED, error=error))
    return results
