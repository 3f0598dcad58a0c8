"""Sending runs outside the beat tick (trigger, replay, backfill).

The same order as the tick (guarantee 5): write the run rows first, let the
database's unique ``(routine_id, idempotency_key, attempt)`` decide which are
new, publish only those, then mark them sent. A row that already existed is
never sent again from here, which is what makes a second backfill a no-op.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .clock import Clock
from .errors import InvalidRoutine
from .publish import OutgoingRun, Publisher
from .store import NewRun, RoutineRecord, Store

logger = logging.getLogger("celery_routines.admin")

SENT = "sent"
EXISTS = "exists"
SEND_FAILED = "send_failed"


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


def decode_call(record: RoutineRecord) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """The stored args, kwargs and apply_async options of a routine."""
    decoded: list[Any] = []
    for label, raw, kind in (
        ("args", record.args, list),
        ("kwargs", record.kwargs, dict),
        ("options", record.options, dict),
    ):
        try:
            value = json.loads(raw) if raw else kind()
        except ValueError as exc:
            raise InvalidRoutine(
                record.name, f"{label} is not valid JSON ({exc}): {raw!r}"
            ) from None
        if not isinstance(value, kind):
            raise InvalidRoutine(
                record.name, f"{label} must be a JSON {kind.__name__}, got {raw!r}"
            )
        decoded.append(value)
    return decoded[0], decoded[1], decoded[2]


def dispatch(
    store: Store,
    publisher: Publisher,
    record: RoutineRecord,
    new_runs: Sequence[NewRun],
    clock: Clock,
) -> list[Dispatched]:
    """Write, send and mark ``new_runs`` of ``record``, oldest first."""
    args, kwargs, options = decode_call(record)
    inserted = store.runs.insert_new(new_runs, clock())
    existing = {
        (row.idempotency_key, row.attempt): row
        for row in store.runs.find_windows(
            [(r.routine_id, r.idempotency_key, r.attempt) for r in new_runs if r.id not in inserted]
        )
    }
    results: list[Dispatched] = []
    sent_ids: list[str] = []
    broker_error: str | None = None
    for run in new_runs:
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
        if broker_error is None:
            broker_error = _publish(publisher, record, run, args, kwargs, options)
            if broker_error is None:
                sent_ids.append(run.id)
                results.append(Dispatched(run, SENT))
                continue
            error = broker_error
        else:
            # One failed publish already waited out its retries: fail the rest
            # at once instead of making the operator wait for each.
            error = f"not sent: {broker_error}"
        store.runs.mark_send_failed(run.id, error, clock())
        results.append(Dispatched(run, SEND_FAILED, error=error))
    store.runs.mark_sent(sent_ids, clock())
    return results


def _publish(
    publisher: Publisher,
    record: RoutineRecord,
    run: NewRun,
    args: list[Any],
    kwargs: dict[str, Any],
    options: dict[str, Any],
) -> str | None:
    outgoing = OutgoingRun(
        run_id=run.id,
        routine_name=record.name,
        task=record.task,
        args=args,
        kwargs=kwargs,
        options=options,
        window=run.scheduled_for,
        idempotency_key=run.idempotency_key,
        attempt=run.attempt,
    )
    try:
        publisher.publish(outgoing)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        logger.error("send failed for %s (run %s): %s", run.idempotency_key, run.id, error)
        return error
    logger.info("sent %s as %s (run %s)", run.idempotency_key, record.task, run.id)
    return None
