"""Sending one run of a routine and recording a failed send; shared by the
window path (tick.py) and the retry path (sweeps.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery_routines.errors import ScheduleError
from celery_routines.policy.runs import SEND_FAILED, after_failure, policy_of
from celery_routines.sending.publish import NotSent, OutgoingRun, Publisher
from celery_routines.store import RoutineRecord, Store

logger = logging.getLogger("celery_routines.beat")


@dataclass(frozen=True)
class Call:
    """What a routine's task is called with."""

    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]


def decode_call(record: RoutineRecord) -> Call:
    """The stored args, kwargs and options; a row with bad JSON is invalid."""
    decoded = []
    for label, raw, kind in (
        ("args", record.args, list),
        ("kwargs", record.kwargs, dict),
        ("options", record.options, dict),
    ):
        try:
            value = json.loads(raw) if raw else kind()
        except ValueError as exc:
            raise ScheduleError(f"{label} is not valid JSON ({exc}): {raw!r}") from None
        if not isinstance(value, kind):
            raise ScheduleError(f"{label} must be a JSON {kind.__name__}, got {raw!r}")
        decoded.append(value)
    return Call(decoded[0], decoded[1], decoded[2])


def outgoing_run(
    record: RoutineRecord,
    call: Call,
    *,
    run_id: str,
    window: datetime,
    idempotency_key: str,
    attempt: int,
) -> OutgoingRun:
    return OutgoingRun(
        run_id=run_id,
        routine_name=record.name,
        task=record.task,
        args=call.args,
        kwargs=call.kwargs,
        options=call.options,
        window=window,
        idempotency_key=idempotency_key,
        attempt=attempt,
    )


def publish_runs(publisher: Publisher, runs: Sequence[OutgoingRun]) -> list[str | None]:
    """Publish runs, batched where the broker allows; for each, None or the
    error text of a failed send."""
    errors = publisher.publish_many(runs)
    texts: list[str | None] = []
    for run, error in zip(runs, errors, strict=True):
        if error is None:
            _log_sent(run)
            texts.append(None)
        else:
            texts.append(_error_text(error))
    return texts


def _log_sent(run: OutgoingRun) -> None:
    logger.info(
        "sent %s attempt %d as %s (run %s)", run.idempotency_key, run.attempt, run.task, run.run_id
    )


def _error_text(error: Exception) -> str:
    if isinstance(error, NotSent):
        return str(error)  # already says what stopped it
    return f"{type(error).__name__}: {error}"


def publish_run(
    publisher: Publisher,
    record: RoutineRecord,
    call: Call,
    *,
    run_id: str,
    window: datetime,
    idempotency_key: str,
    attempt: int,
) -> str | None:
    """Publish one run; the error text if it failed."""
    outgoing = outgoing_run(
        record, call, run_id=run_id, window=window, idempotency_key=idempotency_key, attempt=attempt
    )
    try:
        publisher.publish(outgoing)
    except Exception as exc:
        return _error_text(exc)
    _log_sent(outgoing)
    return None


def record_send_failure(
    store: Store,
    record: RoutineRecord,
    run_id: str,
    idempotency_key: str,
    attempt: int,
    error: str,
    now: datetime,
) -> None:
    """A publish failed: the run is failed with the broker's error and retried
    under the routine's policy (``retrying`` with ``retry_at``)."""
    decision = after_failure(attempt, policy_of(record), now, reason=SEND_FAILED)
    store.runs.fail_send(
        run_id,
        error,
        now,
        state=decision.state,
        retry_at=decision.retry_at,
        reason=decision.reason,
    )
    logger.error(
        "send failed for %s attempt %d (run %s): %s; %s",
        idempotency_key,
        attempt,
        run_id,
        error,
        decision.why,
    )
