"""Sending a run as a normal Celery task message."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from celery import Celery

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


class CeleryPublisher:
    """Publishes through one reused producer (and so one connection)."""

    def __init__(self, app: Celery, producer: Any) -> None:
        self.app = app
        self.producer = producer

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
