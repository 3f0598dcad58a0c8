"""Sending a run as a normal Celery task message.

What Flower shows of a run: Flower (2.2) shows a task's name, args, kwargs,
state and worker, never its message headers. A run keeps its real task name
(no ``shadow``: Flower's name filter and per-task counts keep working) and its
real arguments; only the *displayed* kwargs (``kwargsrepr``) gain the routine's
name, window and attempt in front, under the header names::

    {'routine': 'nightly', 'routine_window': 'nightly@2026-11-30T03:00:00+01:00',
     'routine_attempt': 1, 'day': 'today'}

The task is still called with ``day='today'`` only. The display is a dict
literal, so Flower's search finds a routine's runs exactly with
``kwargs:routine=nightly``; the task id is the run id.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from celery import Celery
from celery._state import _set_task_join_will_block, task_join_will_block
from celery.utils.saferepr import saferepr
from kombu import Connection, Producer
from kombu.exceptions import EncodeError

if TYPE_CHECKING:
    # Only named: the worker imports this module without the schedule stack.
    from celery_routines.policy.routine import Routine

# Message headers that mark a task message as a routine run.
ROUTINE_HEADER = "routine"
WINDOW_HEADER = "routine_window"
ATTEMPT_HEADER = "routine_attempt"
# A routine's own run_timeout (seconds without a heartbeat), for the worker.
RUN_TIMEOUT_HEADER = "routine_run_timeout"
# Read by current_run() (worker/current_run.py): the routine's own zone (when
# it names one), the kind of a run not sent for its schedule, and the instant
# of a run whose key carries none (a trigger's ``name@manual:<uuid>``).
ZONE_HEADER = "routine_zone"
KIND_HEADER = "routine_kind"
WINDOW_AT_HEADER = "routine_window_at"


def header_of(request: object, name: str) -> Any:
    """A header's value on a worker's request, as the message sent it (Celery
    also copies a message's headers onto the request as attributes)."""
    headers = getattr(request, "headers", None)
    if isinstance(headers, dict) and name in headers:
        return headers[name]
    return getattr(request, name, None)


ROUTINE_HEADERS = (
    ROUTINE_HEADER,
    WINDOW_HEADER,
    ATTEMPT_HEADER,
    RUN_TIMEOUT_HEADER,
    ZONE_HEADER,
    KIND_HEADER,
    WINDOW_AT_HEADER,
)

# Bounded: a broker outage must not stall the tick for long per message.
PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5}
# Messages per broker round trip when the transport can batch (Redis): one
# pipeline each. Large enough that a burst pays a few round trips, small
# enough that a pipeline stays a few hundred kilobytes.
MESSAGES_PER_BATCH = 500
# saferepr's depth for the kwargs Flower shows, where Celery has no setting for it.
REPR_MAXLEVELS = 3

logger = logging.getLogger("celery_routines.beat")


@dataclass(frozen=True)
class OutgoingRun:
    run_id: str
    routine_name: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    window: datetime
    idempotency_key: str
    attempt: int
    run_timeout: float | None = None
    timezone: str | None = None  # the routine's own zone; None: routines_timezone
    kind: str = "scheduled"  # RunKind: scheduled, backfill, replay or trigger
    # The routine's definition, for a publisher that monitors runs (Sentry
    # Crons, integrations/sentry.py), which drops it before the run is sent.
    routine: Routine | None = field(default=None, compare=False, repr=False)


class NotSent(Exception):
    """A run not attempted: an earlier send of the same batch failed after
    its retries, so the broker is taken to be down."""


def _message_local(error: Exception) -> bool:
    """An error of one message (found before any retry), not of the broker."""
    return isinstance(error, (EncodeError, TypeError, ValueError))


def broker_down(runs: Sequence[OutgoingRun], error: Exception) -> list[Exception | None]:
    """The errors of runs whose broker could not be reached within the
    publish retry policy: the first send's, and the rest not attempted."""
    return [error, *(_not_sent([error]) for _ in runs[1:])]


def _not_sent(errors: Sequence[Exception | None]) -> NotSent:
    first = next(e for e in errors if e is not None and not _message_local(e))
    if isinstance(first, NotSent):
        return first
    return NotSent(f"not sent: {type(first).__name__}: {first}")


# The errors of runs handed to a publisher, once it has sent them (waits).
PendingErrors = Callable[[], list[Exception | None]]


class Publisher(Protocol):
    """What beat and the operator's sends publish runs through.

    A publisher that sends in another process (``sending/offload.py``) says
    :attr:`in_background` and returns from :meth:`begin_publish_many` at
    once, so the tick prepares the next chunk while this one goes out; any
    other publisher subclasses this protocol for the defaults: not in the
    background, and :meth:`begin_publish_many` sends here and now.
    """

    def publish(self, run: OutgoingRun) -> None:
        """Send one run; raise on failure."""
        ...

    def publish_many(self, runs: Sequence[OutgoingRun]) -> list[Exception | None]:
        """Send runs in order; for each, None or the error that stopped it."""
        ...

    @property
    def in_background(self) -> bool:
        """Whether :meth:`begin_publish_many` returns before the runs are sent."""
        return False

    def begin_publish_many(self, runs: Sequence[OutgoingRun]) -> PendingErrors:
        """Start sending ``runs``; the call returned waits for each one's error."""
        errors = self.publish_many(runs)
        return lambda: errors

    def close(self) -> None: ...


class BatchingPublisher(Publisher):
    """Publishes through one reused connection and producer; subclasses say
    how one message goes out (``_send``).

    The connection is opened lazily by the first publish, so a broker that is
    down when beat starts fails sends (which are recorded and retried) instead
    of stopping beat from ticking.

    ``publish_many`` goes through kombu's publish batches where the transport
    has them (Redis: one pipeline per ``MESSAGES_PER_BATCH`` messages instead
    of a round trip each), else sends one by one. An error of one message
    (found before any retry) fails that run only; any other error is taken to
    mean the broker is down, and the runs after it are not attempted.
    """

    def __init__(self, app: Celery, *, subscribe_to_results: bool = True) -> None:
        self.app = app
        # False for beat, which never reads a result (see results_never_awaited).
        self.subscribe_to_results = subscribe_to_results
        self._connection: Connection | None = None
        self._producer: Producer | None = None

    @cached_property
    def _repr_limits(self) -> tuple[int, int]:
        # Read once: each is a lookup through Celery's layered settings.
        # Celery 5.5 and older have no task_repr_maxlevels (they nest 3 levels).
        maxlevels = self.app.conf.get("task_repr_maxlevels", REPR_MAXLEVELS)
        return self.app.amqp.kwargsrepr_maxsize, maxlevels

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._connection = self.app.connection_for_write()
            self._producer = self.app.amqp.Producer(self._connection, auto_declare=False)
        return self._producer

    def publish(self, run: OutgoingRun) -> None:
        self._send(run)

    def publish_many(self, runs: Sequence[OutgoingRun]) -> list[Exception | None]:
        if len(runs) < 2:
            return self._one_by_one(runs)
        try:
            self._connected_producer()
        except Exception as exc:
            return broker_down(runs, exc)
        if not self._can_batch():
            return self._one_by_one(runs)
        errors: list[Exception | None] = []
        for start in range(0, len(runs), MESSAGES_PER_BATCH):
            chunk = runs[start : start + MESSAGES_PER_BATCH]
            if any(error is not None and not _message_local(error) for error in errors):
                errors.extend(_not_sent(errors) for _ in chunk)
            else:
                errors.extend(self._publish_batch(chunk))
        return errors

    def _connected_producer(self) -> Producer:
        """The producer, connected within the publish retry policy, as
        ``send_task`` connects inside its publish's retries: a batch (or
        ``producer.channel``) would connect under kombu's own connection
        retries (``broker_connection_timeout``), and a beat whose broker is
        down would wait those out on every tick (6 s a try here, not 1 s)."""
        producer = self.producer
        connection = producer.connection
        if not connection.connected:
            connection.ensure_connection(**PUBLISH_RETRY_POLICY)
        return producer

    def _can_batch(self) -> bool:
        return bool(getattr(self.producer, "supports_batch_publish", False))

    def _publish_batch(self, runs: Sequence[OutgoingRun]) -> list[Exception | None]:
        errors: list[Exception | None] = []
        try:
            # max_size counts Redis commands; room for all so it flushes once, at the end.
            with self.producer.batch(max_size=4 * len(runs) + 16):
                self._send_each(runs, lambda run: self._send(run, batched=True), errors)
        except Exception as exc:
            return self._resend_one_by_one(runs, errors, exc)
        return errors

    @staticmethod
    def _send_each(
        runs: Sequence[OutgoingRun],
        send: Callable[[OutgoingRun], None],
        errors: list[Exception | None],
    ) -> None:
        """Each run into the batch, its error (or None) appended to ``errors``;
        an error that is not the message's own stops the batch."""
        for run in runs:
            try:
                send(run)
            except Exception as exc:
                if not _message_local(exc):
                    raise
                errors.append(exc)  # this message only (say, an unserialisable kwarg)
            else:
                errors.append(None)

    def _resend_one_by_one(
        self, runs: Sequence[OutgoingRun], errors: list[Exception | None], exc: Exception
    ) -> list[Exception | None]:
        """The batch was discarded, or it failed part way so nobody knows
        which messages the broker took: send each on its own, with the retry
        policy. A message that arrives twice is refused by the worker's claim
        on its run row."""
        logger.warning(
            "batched publish of %d run(s) failed (%s: %s); sending them one by one",
            len(runs),
            type(exc).__name__,
            exc,
        )
        # A failed batch can leave the producer without a channel; start
        # the one-by-one sends on a fresh connection.
        self.close()
        return self._one_by_one(runs, known=errors)

    def _one_by_one(
        self, runs: Sequence[OutgoingRun], known: Sequence[Exception | None] = ()
    ) -> list[Exception | None]:
        errors: list[Exception | None] = []
        for i, run in enumerate(runs):
            if i < len(known) and known[i] is not None:
                errors.append(known[i])
            elif any(error is not None and not _message_local(error) for error in errors):
                # One send already waited out its retries; do not make every
                # other run wait too.
                errors.append(_not_sent(errors))
            else:
                errors.append(self._attempt(run))
        return errors

    def _attempt(self, run: OutgoingRun) -> Exception | None:
        try:
            self._send(run)
        except Exception as exc:
            return exc
        return None

    def _send(self, run: OutgoingRun, batched: bool = False) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self._connection is not None:
            self._connection.release()
        self._connection = self._producer = None


class CeleryPublisher(BatchingPublisher):
    """Every message built and sent by ``app.send_task``: routing, signals and
    message format are Celery's own (the default, ``routines_publish = "send_task"``)."""

    def _send(self, run: OutgoingRun, batched: bool = False) -> None:
        options, headers = message_options(run, batched, self._repr_limits)
        send_with_celery(self.app, self.producer, run, options, headers, self.subscribe_to_results)


def message_options(
    run: OutgoingRun, batched: bool, repr_limits: tuple[int, int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``send_task`` options and message headers of a run, the same for
    every publisher: the routine's options, its headers with ours added, the
    bounded retry policy and the kwargs Flower shows."""
    options = dict(run.options)
    headers = dict(options.pop("headers", None) or {})
    headers.update(
        {
            ROUTINE_HEADER: run.routine_name,
            WINDOW_HEADER: run.idempotency_key,
            ATTEMPT_HEADER: run.attempt,
            # What Celery's own beat sets, so code that checks it keeps working.
            "celery_beat_task": True,
        }
    )
    if run.run_timeout is not None:
        headers[RUN_TIMEOUT_HEADER] = run.run_timeout
    if run.timezone is not None:
        headers[ZONE_HEADER] = run.timezone
    if run.kind != "scheduled":
        headers[KIND_HEADER] = run.kind
    if "@manual:" in run.idempotency_key:
        headers[WINDOW_AT_HEADER] = run.window.isoformat()
    options.setdefault("retry_policy", PUBLISH_RETRY_POLICY)
    if batched:
        # Nothing goes over the wire until the batch flushes; a failed
        # flush falls back to sending one by one with the retry policy.
        options["retry"] = False
    options["kwargsrepr"] = shown_kwargs(run, options.get("kwargsrepr"), *repr_limits)
    return options, headers


def send_with_celery(
    app: Celery,
    producer: Producer,
    run: OutgoingRun,
    options: dict[str, Any],
    headers: dict[str, Any],
    subscribe_to_results: bool = True,
) -> None:
    with nullcontext() if subscribe_to_results else results_never_awaited():
        app.send_task(
            run.task,
            args=run.args,
            kwargs=run.kwargs,
            task_id=run.run_id,
            producer=producer,
            headers=headers,
            add_to_parent=False,
            **options,
        )


# Senders inside results_never_awaited() now, and Celery's flag before the first.
_not_awaiting = 0
_flag_before = False
_not_awaiting_lock = threading.Lock()


@contextmanager
def results_never_awaited() -> Iterator[None]:
    """Beat's sends: without ``send_task`` subscribing beat to each result.

    With a Redis result backend, ``send_task`` subscribes the sender to every
    task's result channel in case it waits on the result (celery/celery#3808,
    #5320): a SUBSCRIBE per message and, on Celery 5.7, an UNSUBSCRIBE when the
    result object is collected; before 5.7 the subscriptions pile up for the
    life of the process. Beat never reads a result, so it sends as Celery's own
    pool processes do, under Celery's flag that a result is never waited on;
    the message is unchanged (the worker still stores the result). The flag is
    process-wide: it is raised while any thread sends this way and lowered
    back to what it was when the last one is done. Only beat's publisher uses
    it; a process that may wait on results in another thread (the panel, the
    Python API in an application) sends as ``send_task`` always does.
    """
    global _not_awaiting, _flag_before
    with _not_awaiting_lock:
        if _not_awaiting == 0:
            _flag_before = task_join_will_block()
            _set_task_join_will_block(True)
        _not_awaiting += 1
    try:
        yield
    finally:
        with _not_awaiting_lock:
            _not_awaiting -= 1
            if _not_awaiting == 0:
                _set_task_join_will_block(_flag_before)


def shown_kwargs(
    run: OutgoingRun, kwargsrepr: str | None = None, maxsize: int = 1024, maxlevels: int = 3
) -> str:
    """The kwargs Flower shows for a run: the routine's fields first (so a
    long repr truncated by Celery never hides them), then the task's own
    kwargs, or the ``kwargsrepr`` a routine's options set to hide them."""
    ours = (
        f"{ROUTINE_HEADER!r}: {run.routine_name!r}, {WINDOW_HEADER!r}: {run.idempotency_key!r}, "
        f"{ATTEMPT_HEADER!r}: {run.attempt!r}"
    )
    if kwargsrepr is not None:
        shown = kwargsrepr
    else:
        # Most routines pass no kwargs: skip saferepr's walk for what it would say.
        shown = saferepr(run.kwargs, maxsize, maxlevels) if run.kwargs else "{}"
    if shown.startswith("{") and shown.endswith("}"):
        inner = shown[1:-1].strip()
        return "{" + ours + (", " + inner if inner else "") + "}"
    return "{" + ours + "} " + shown
