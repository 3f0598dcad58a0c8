"""The one publish path of every run: a tick's windows, its retries and an
operator's sends all build their messages with :func:`outgoing_run` and go
out through :class:`Sender`.

It publishes in chunks of ``PUBLISH_CHUNK`` (kombu's Redis batch), handing a
chunk to a publisher in another process while the previous one's answer is
awaited; before each chunk it asks the caller's claims which routines still
hold (the tick renews claims that aged, and leaves a routine taken over to
its new holder); it enters what went out where the caller writes it down
(the tick's ledger, or at once ``sent`` for an operator's send), marks the
chunks before the last ``sent`` while the claims hold, and records a send the
broker refused under the routine's retry policy (:func:`record_send_failure`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from celery_routines.clock import Clock
from celery_routines.policy.routine import Routine
from celery_routines.policy.runs import (
    after_failure,
    lost_deadline,
    policy_of,
    unstarted_timeout,
)
from celery_routines.policy.states import Reason, RunKind
from celery_routines.schedules.jitter import send_instant
from celery_routines.sending.publish import NotSent, OutgoingRun, Publisher
from celery_routines.store import NewRun, RoutineRecord, Store

logger = logging.getLogger("celery_routines.beat")

# Messages published between two looks at the claims (kombu's Redis batch).
PUBLISH_CHUNK = 500


@dataclass(frozen=True)
class Outbound:
    """One written run to publish: its message, and the routine row whose
    retry policy a refused send is recorded under."""

    message: OutgoingRun
    record: RoutineRecord


class PublishedSink(Protocol):
    """Where what went out is written down (the tick's ledger, or
    :class:`MarkSentNow`): each run with its routine's own run_timeout."""

    def published(
        self, run_ids: Sequence[str], sent_at: datetime, timeouts: Sequence[float | None] = ()
    ) -> None: ...


class Claims(Protocol):
    """The routines whose claims still hold, asked before each chunk (the
    tick renews claims that aged; a routine taken over is not published)."""

    def held(self) -> set[int]: ...


class Marker(Protocol):
    """Marks what the sink holds ``sent`` while the next chunk goes out:
    :meth:`start` after a chunk that is not the last, :meth:`finish` waits."""

    def start(self) -> None: ...

    def finish(self) -> None: ...


class MarkSentNow:
    """An operator's sends: marked ``sent`` at once, each with its lost
    deadline (the routine's run_timeout, else ``run_timeout``, or
    ``start_timeout`` if shorter: :func:`unstarted_timeout`)."""

    def __init__(self, store: Store, run_timeout: float, start_timeout: float | None) -> None:
        self.store = store
        self.run_timeout = run_timeout
        self.start_timeout = start_timeout

    def published(
        self, run_ids: Sequence[str], sent_at: datetime, timeouts: Sequence[float | None] = ()
    ) -> None:
        by_timeout: dict[float | None, list[str]] = {}
        for run_id, timeout in zip(run_ids, timeouts or [None] * len(run_ids), strict=True):
            by_timeout.setdefault(timeout, []).append(run_id)
        for timeout, ids in by_timeout.items():
            waits = unstarted_timeout(timeout or self.run_timeout, self.start_timeout)
            deadline = lost_deadline(sent_at, waits)
            self.store.runs.mark_sent(ids, sent_at, deadline_at=deadline)


@dataclass
class SendReport:
    """What one :meth:`Sender.send` did."""

    sent: int = 0
    failed: int = 0
    # Each attempted run's error (None: it went out), by run id.
    errors: dict[str, str | None] = field(default_factory=dict)
    # Runs not attempted: the caller stopped the sending (``stop``).
    left: list[Outbound] = field(default_factory=list)


@dataclass(frozen=True)
class _InFlight:
    """A chunk handed to the publisher, and the wait for its answer."""

    chunk: list[Outbound]
    errors: Callable[[], list[str | None]]


class Sender:
    def __init__(self, store: Store, publisher: Publisher, clock: Clock) -> None:
        self.store = store
        self.publisher = publisher
        self.clock = clock

    def send(
        self,
        items: Sequence[Outbound],
        sink: PublishedSink,
        *,
        claims: Claims | None = None,
        marker: Marker | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> SendReport:
        """Publish ``items`` in chunks, oldest first; what went out is entered
        in ``sink``, what the broker refused is recorded. ``claims``: only the
        runs of routines still held go out; ``marker``: chunks before the last
        are marked sent while the claims hold; ``stop``: asked before each
        chunk, True leaves the rest unattempted (``SendReport.left``)."""
        report = SendReport()
        try:
            self._publish_chunks(items, sink, report, claims, marker, stop)
        except BaseException:
            if marker is not None:
                # The error in flight wins; a failed marking's batches stay in the ledger.
                with suppress(Exception):
                    marker.finish()
            raise
        if marker is not None:
            marker.finish()
        return report

    def _publish_chunks(
        self,
        items: Sequence[Outbound],
        sink: PublishedSink,
        report: SendReport,
        claims: Claims | None,
        marker: Marker | None,
        stop: Callable[[], bool] | None,
    ) -> None:
        size = PUBLISH_CHUNK
        # The chunk handed to the publisher and not yet answered: a publisher
        # in another process sends it while this one prepares the next. It is
        # taken out of ``in_flight`` before its answer is entered, so an error
        # while entering it never has that answer waited for twice.
        in_flight: _InFlight | None = None
        in_background = self.publisher.in_background
        try:
            for start in range(0, len(items), size):
                if stop is not None and stop():
                    last, in_flight = in_flight, None
                    self._answered(last, sink, report)
                    report.left = list(items[start:])
                    return
                chunk = list(items[start : start + size])
                if claims is not None:
                    held = claims.held()
                    chunk = [item for item in chunk if item.record.id in held]
                messages = [item.message for item in chunk]
                pending = self.publisher.begin_publish_many(messages)
                started = _InFlight(chunk, _texts(messages, pending))
                if in_background:
                    previous, in_flight = in_flight, started
                    self._answered(previous, sink, report, marker)
                else:
                    more = marker if start + size < len(items) else None
                    self._answered(started, sink, report, more)
            last, in_flight = in_flight, None
            self._answered(last, sink, report)
        except BaseException:
            # What went out is entered in the sink; the error in flight wins.
            with suppress(Exception):
                self._answered(in_flight, sink, report)
            raise

    def _answered(
        self,
        in_flight: _InFlight | None,
        sink: PublishedSink,
        report: SendReport,
        marker: Marker | None = None,
    ) -> None:
        """Wait for a chunk's answer and enter it; with a ``marker`` (more
        chunks after it), mark it sent now, while the claims still hold (a
        beat that takes a routine over later finds the row sent)."""
        if in_flight is None:
            return
        errors = in_flight.errors()
        went = [item for item, error in zip(in_flight.chunk, errors, strict=True) if not error]
        sink.published(
            [item.message.run_id for item in went],
            self.clock(),
            [item.message.run_timeout for item in went],
        )
        for item, error in zip(in_flight.chunk, errors, strict=True):
            message = item.message
            report.errors[message.run_id] = error
            if error is None:
                report.sent += 1
                continue
            report.failed += 1
            record_send_failure(
                self.store,
                item.record,
                message.run_id,
                message.idempotency_key,
                message.attempt,
                error,
                self.clock(),
            )
        if marker is not None:
            marker.start()


def _texts(
    messages: Sequence[OutgoingRun], pending: Callable[[], list[Exception | None]]
) -> Callable[[], list[str | None]]:
    return lambda: sent_or_failed(messages, pending())


# -- the pieces: a run's message, a batch's errors, a refused send ---------------


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
