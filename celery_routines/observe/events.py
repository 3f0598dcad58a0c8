"""Celery events of our own type: skips, suspensions and lost runs.

They go out on Celery's event exchange (``celeryev``), so any event consumer
(``app.events.Receiver``, ``celery events``, Flower's event stream) can
subscribe to them. Their type is ``routine-<what>``: not ``task-...``, so
Flower counts them without mistaking them for task states.

Sending an event never raises into the caller: monitoring must not stop a tick
or an operator command. A failure is logged once until a send works again.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any, Protocol

from celery import Celery
from celery.events import EventDispatcher

from celery_routines.observe.notify import DROPPED_WINDOWS, DROPPING_REASONS, Notifies, notifier_for
from celery_routines.observe.notify import INVALID as NOTIFY_INVALID
from celery_routines.observe.notify import LOST as NOTIFY_LOST
from celery_routines.observe.notify import SUSPENDED as NOTIFY_SUSPENDED
from celery_routines.store import Store

logger = logging.getLogger("celery_routines.events")

SKIPPED = "routine-skipped"
SUSPENDED = "routine-suspended"
LOST = "routine-lost"
TRIGGERED = "routine-triggered"
RETIRED = "routine-retired"


def _field(value: object) -> object:
    # Event bodies are serialised with the app's event serializer (JSON).
    return value.isoformat() if isinstance(value, datetime) else value


class Events(Protocol):
    """What the tick reports as events (``RoutineEvents``, or ``NoEvents``)."""

    def skipped(
        self,
        routine: str,
        *,
        reason: str,
        count: int,
        first: datetime,
        last: datetime,
        run_id: str | None = None,
    ) -> None: ...

    def suspended(self, routine: str, *, until: datetime, reason: str) -> None: ...

    def lost(self, routine: str, *, run_id: str, idempotency_key: str) -> None: ...

    def invalid(self, routine: str, *, error: str, before: str | None = None) -> None: ...

    # Who is told of final failures and automatic pauses (routines_notify_url,
    # or the routine's own notify_url).
    notifier: Notifies | None

    def close(self) -> None: ...


class NoEvents:
    """Events switched off (tests and embedders that pass no app)."""

    notifier: Notifies | None = None

    def skipped(self, routine: str, **fields: object) -> None:
        pass

    def suspended(self, routine: str, **fields: object) -> None:
        pass

    def lost(self, routine: str, **fields: object) -> None:
        pass

    def invalid(self, routine: str, **fields: object) -> None:
        pass

    def close(self) -> None:
        pass


class RoutineEvents:
    """Publishes routine events through one lazily opened connection."""

    notifier: Notifies | None = None

    def __init__(
        self, app: Celery, hostname: str | None = None, store: Store | None = None
    ) -> None:
        self.app = app
        self.hostname = hostname
        self._connection: Any = None
        self._dispatcher: Any = None
        self._failing = False
        self._lock = threading.RLock()
        # The same moments, posted to the routine's notify_url (read from
        # ``store``), else to routines_notify_url when it is set.
        self.notifier = notifier_for(app, store.streaks.notify_url if store is not None else None)

    def skipped(
        self,
        routine: str,
        *,
        reason: str,
        count: int,
        first: datetime,
        last: datetime,
        run_id: str | None = None,
    ) -> None:
        self.send(
            SKIPPED, routine=routine, reason=reason, count=count, first=first, last=last,
            run_id=run_id,
        )  # fmt: skip
        if self.notifier is not None and reason in DROPPING_REASONS:
            self.notifier.notify(
                DROPPED_WINDOWS, routine, window=first, run_id=run_id, state="skipped",
                reason=reason, count=count, first=first, last=last,
            )  # fmt: skip

    def suspended(self, routine: str, *, until: datetime, reason: str) -> None:
        self.send(SUSPENDED, routine=routine, until=until, reason=reason)
        if self.notifier is not None:
            self.notifier.notify(NOTIFY_SUSPENDED, routine, reason=reason, until=until)

    def lost(self, routine: str, *, run_id: str, idempotency_key: str) -> None:
        self.send(LOST, routine=routine, run_id=run_id, idempotency_key=idempotency_key)
        if self.notifier is not None:
            self.notifier.notify(
                NOTIFY_LOST, routine, run_id=run_id, state="lost",
                reason="no outcome by the run's deadline", idempotency_key=idempotency_key,
            )  # fmt: skip

    def invalid(self, routine: str, *, error: str, before: str | None = None) -> None:
        """A routine marked invalid (its definition cannot be computed): notified
        only, and only when it became invalid or invalid in another way than ``before``."""
        if self.notifier is not None and error != before:
            self.notifier.notify(NOTIFY_INVALID, routine, reason=error)

    def retired(self, routine: str, *, since: datetime, owner: str | None) -> None:
        """A code routine its owner no longer declares: it is not fired any more."""
        self.send(RETIRED, routine=routine, since=since, owner=owner)

    def triggered(self, routine: str, *, run_id: str, idempotency_key: str, how: str) -> None:
        """An operator sent a run by hand (``how``: trigger, replay, backfill)."""
        self.send(
            TRIGGERED, routine=routine, run_id=run_id, idempotency_key=idempotency_key, how=how
        )

    def send(self, event_type: str, **fields: object) -> None:
        # A burst's next batch is written (its skips reported) on another
        # thread while the tick's thread reports late skips (tick/ahead.py).
        with self._lock:
            self._send(event_type, fields)

    def _send(self, event_type: str, fields: dict[str, object]) -> None:
        try:
            dispatcher = self._get_dispatcher()
            dispatcher.send(event_type, **{k: _field(v) for k, v in fields.items()})
        except Exception as exc:
            if not self._failing:
                logger.warning(
                    "could not send the %s event (%s); will keep trying", event_type, exc
                )
                self._failing = True
            self.close()
            return
        if self._failing:
            logger.info("routine events are sent again")
            self._failing = False

    def _get_dispatcher(self) -> EventDispatcher:
        if self._dispatcher is None:
            self._connection = self.app.connection_for_write()
            # One quick try: an event is not worth holding the tick while the
            # broker is away (kombu's own retries took 6 s per event, so a
            # broker outage stalled every tick that had a skip to report).
            self._connection.ensure_connection(max_retries=1)
            self._dispatcher = self.app.events.Dispatcher(
                self._connection,
                hostname=self.hostname,
                enabled=True,
                # An event for a monitoring consumer is worth nothing late:
                # do not queue them in memory while the broker is away.
                buffer_while_offline=False,
            )
        return self._dispatcher

    def close(self) -> None:
        with self._lock:
            dispatcher, connection = self._dispatcher, self._connection
            self._dispatcher = self._connection = None
        for closing in (dispatcher, connection):
            if closing is None:
                continue
            try:
                closing.close() if closing is dispatcher else closing.release()
            except Exception:  # closing a broken connection may raise again
                logger.debug("error closing the event connection", exc_info=True)
