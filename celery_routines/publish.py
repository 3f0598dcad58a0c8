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

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from celery import Celery
from celery.utils.saferepr import saferepr

# Message headers that mark a task message as a routine run.
ROUTINE_HEADER = "routine"
WINDOW_HEADER = "routine_window"
ATTEMPT_HEADER = "routine_attempt"

# Bounded: a broker outage must not stall the tick for long per message.
PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5}


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


class Publisher(Protocol):
    def publish(self, run: OutgoingRun) -> None:
        """Send one run; raise on failure."""
        ...

    def close(self) -> None: ...


class CeleryPublisher:
    """Publishes through one reused connection and producer.

    The connection is opened lazily by the first publish, so a broker that is
    down when beat starts fails sends (which are recorded and retried) instead
    of stopping beat from ticking.
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._connection: Any = None
        self._producer: Any = None

    @property
    def producer(self) -> Any:
        if self._producer is None:
            self._connection = self.app.connection_for_write()
            self._producer = self.app.amqp.Producer(self._connection, auto_declare=False)
        return self._producer

    def publish(self, run: OutgoingRun) -> None:
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
        options.setdefault("retry_policy", PUBLISH_RETRY_POLICY)
        options["kwargsrepr"] = shown_kwargs(
            run,
            options.get("kwargsrepr"),
            self.app.amqp.kwargsrepr_maxsize,
            self.app.conf.task_repr_maxlevels,
        )
        self.app.send_task(
            run.task,
            args=run.args,
            kwargs=run.kwargs,
            task_id=run.run_id,
            producer=self.producer,
            headers=headers,
            add_to_parent=False,
            **options,
        )

    def close(self) -> None:
        if self._connection is not None:
            self._connection.release()
        self._connection = self._producer = None


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
    shown = kwargsrepr if kwargsrepr is not None else saferepr(run.kwargs, maxsize, maxlevels)
    if shown.startswith("{") and shown.endswith("}"):
        inner = shown[1:-1].strip()
        return "{" + ours + (", " + inner if inner else "") + "}"
    return "{" + ours + "} " + shown
