"""The pieces of every run's publish (a tick's windows, its retries, an
operator's sends, all through :class:`~celery_routines.sending.sender.Sender`):
the message of a run, the errors of a batch publish with its log lines, and
a failed send recorded under the routine's retry policy."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta

from celery_routines.policy.routine import Routine
from celery_routines.policy.runs import after_failure, policy_of
from celery_routines.policy.states import Reason, RunKind
from celery_routines.schedules.jitter import send_instant
from celery_routines.sending.publish import NotSent, OutgoingRun, Publisher
from celery_routines.store import NewRun, RoutineRecord, Store

logger = logging.getLogger("celery_routines.beat")


def outgoing_run(
    routine: Routine, run: NewRun, run_id: str | None = None, kind: str = RunKind.SCHEDULED
) -> OutgoingRun:
    """The message of ``run`` of ``routine``; ``run_id`` when the row that
    goes out is another with the same window (a dead beat's, taken over);
    ``kind`` when an operator sent it (backfill, replay, trigger)."""
    options = dict(routine.options)
    expires = message_expiry(routine, run)
    if expires is not None:
        options.setdefault("expires", expires)
    return OutgoingRun(
        run_id=run_id or run.id,
        routine_name=routine.name,
        task=routine.task,
        args=list(routine.args),
        kwargs=dict(routine.kwargs),
        options=options,
        window=run.scheduled_for,
        idempotency_key=run.idempotency_key,
        attempt=run.attempt,
        run_timeout=routine.run_timeout,
        timezone=routine.timezone,
        kind=kind,
        # Only a process that loaded sentry_sdk monitors runs (integrations/sentry.py).
        routine=routine if "sentry_sdk" in sys.modules else None,
    )


def message_expiry(routine: Routine, run: NewRun) -> datetime | None:
    """Celery's ``expires`` for a window of a routine with ``max_lateness``:
    its send instant (the window, or its jittered instant) plus
    ``max_lateness``, so a worker that takes it later drops it (the worker
    records the run ``skipped``, reason ``expired``). Retries (attempt > 1)
    go out long after their window and carry none; an ``expires`` the
    routine's own options set wins."""
    if routine.max_lateness is None or run.attempt != 1:
        return None
    return send_instant(run.scheduled_for, routine.name, routine.jitter) + timedelta(
        seconds=routine.max_lateness
    )


def publish_runs(publisher: Publisher, runs: Sequence[OutgoingRun]) -> list[str | None]:
    """Publish runs, batched where the broker allows; for each, None or the
    error text of a failed send."""
    return sent_or_failed(runs, publisher.publish_many(runs))


def sent_or_failed(
    runs: Sequence[OutgoingRun], errors: Sequence[Exception | None]
) -> list[str | None]:
    """For each run, None (logged as sent) or the error text of a failed send."""
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
    decision = after_failure(attempt, policy_of(record), now, reason=Reason.SEND_FAILED)
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
