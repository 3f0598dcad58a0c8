"""``celery_routines.Scheduler``: a thin adapter between Celery's beat service
and the tick engine.

Celery's stock heap loop asks "which entry is due" in memory and spins before
each due entry; this scheduler overrides ``tick`` to ask the database instead
and sleeps until the next due instant.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Any, NoReturn

from celery import Celery
from celery.beat import Scheduler as CeleryScheduler
from sqlalchemy.exc import SQLAlchemyError

from .clock import Clock, utc_now
from .config import Settings, settings_from
from .errors import RoutinesError
from .observe.events import RoutineEvents
from .observe.metrics import MeasuredPublisher, RoutineMetrics, metrics_for
from .registry import celery_default_entries, definitions_for
from .sending.gate import Gate, OpenGate, RedisGate
from .sending.publish import CeleryPublisher, Publisher
from .store import Store
from .store.engine import explain_database_error, safe_url
from .tick.engine import TickEngine

logger = logging.getLogger("celery_routines.beat")

# After an error (database or broker unreachable) the tick backs off, doubling
# up to this cap, so a long outage costs a few log lines, not a hot loop.
ERROR_BACKOFF_START = 1.0
ERROR_BACKOFF_CAP = 30.0
# Wake a little after the due instant, not before it: waking early only to find
# nothing due is the spin the stock loop suffers from.
WAKE_SLACK = 0.005


class Scheduler(CeleryScheduler):
    """Database-backed beat scheduler; see the README for settings."""

    def __init__(self, app: Celery, *args: Any, clock: Clock | None = None, **kwargs: Any) -> None:
        self._clock: Clock = clock or utc_now
        self._engine: TickEngine | None = None
        self._store: Store | None = None
        self._gate: Gate | None = None
        self._closed = False
        self._error_backoff = 0.0
        try:
            self.settings: Settings = settings_from(app)
        except RoutinesError as exc:
            cannot_start(exc, None)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.last_report = None
        # Served from setup_schedule, so the banner's lazy instance serves nothing.
        self.metrics: RoutineMetrics | None = None
        super().__init__(app, *args, **kwargs)

    # Celery calls this from __init__ unless lazy=True (the banner's instance),
    # so the lazy instance never touches the database.
    def setup_schedule(self) -> None:
        try:
            self._set_up()
        except Exception as exc:
            cannot_start(exc, self.settings.database_url)

    def _set_up(self) -> None:
        store = Store.from_url(self.settings.database_url)
        store.migrate()
        definitions = definitions_for(self.app)
        store.routines.upsert_definitions([d.columns() for d in definitions], self._clock())
        logger.info(
            "celery-routines: %s",
            _written(self.app, [d.name for d in definitions], self.settings.database_url),
        )
        self._store = store
        if self.metrics is None:
            self.metrics = metrics_for(self.app, self._clock)
        self._gate = (
            RedisGate(self.settings.redis_url, self.holder, self.settings.lock_ttl)
            if self.settings.redis_url
            else OpenGate()
        )

    @property
    def engine(self) -> TickEngine:
        if self._engine is None:
            if self._store is None:
                self.setup_schedule()
            assert self._store is not None and self._gate is not None
            publisher: Publisher = CeleryPublisher(self.app)
            if self.metrics is not None:
                publisher = MeasuredPublisher(publisher, self.metrics, self._clock)
            self._engine = TickEngine(
                self._store,
                publisher,
                self._gate,
                self.settings,
                self.holder,
                self._clock,
                events=RoutineEvents(self.app, hostname=self.holder),
            )
        return self._engine

    @property
    def store(self) -> Store:
        return self.engine.store

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass over the database; returns the seconds to sleep."""
        try:
            report = self.engine.tick()
        except Exception:
            if self.metrics is not None:
                self.metrics.observe_tick_error()
            self._error_backoff = min(
                max(self._error_backoff * 2, ERROR_BACKOFF_START), ERROR_BACKOFF_CAP
            )
            logger.exception("beat tick failed; trying again in %.0f s", self._error_backoff)
            return min(self._error_backoff, self.max_interval)
        if self._error_backoff:
            logger.info("beat tick succeeded again after errors")
            self._error_backoff = 0.0
        self.last_report = report
        if self.metrics is not None:
            self.metrics.observe_tick(report, self._store)
        if report.more_due:
            return 0.0
        if report.next_wakeup is None:
            return float(self.max_interval)
        until = (report.next_wakeup - self._clock()).total_seconds() + WAKE_SLACK
        return min(max(until, WAKE_SLACK), float(self.max_interval))

    # The stock scheduler's in-memory schedule is unused; keep Celery's own
    # callers (banner, sync) harmless.
    @property
    def schedule(self) -> dict[str, Any]:
        return {}

    def sync(self) -> None:
        pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.metrics is not None:
            self.metrics.close()
        if self._gate is not None:
            self._gate.close()
        if self._engine is not None:
            self._engine.publisher.close()
            self._engine.events.close()
        if self._store is not None:
            self._store.dispose()
        super().close()

    @property
    def info(self) -> str:
        gate = "redis" if self.settings.redis_url else "database only"
        return (
            f"    . routines db -> {safe_url(self.settings.database_url)}\n"
            f"    . idempotency gate -> {gate}"
        )


def _written(app: Celery, names: list[str], database_url: str) -> str:
    """``wrote 3 routine(s) declared in code to <url>``, naming the ones the
    user did not declare and why they exist (a routine nobody declared looks
    like a bug)."""
    defaults = {d.name for d in celery_default_entries(app)} & set(names)
    text = f"wrote {len(names) - len(defaults)} routine(s) declared in code"
    if "celery.backend_cleanup" in defaults:
        text += " and celery.backend_cleanup"
    text += f" to {safe_url(database_url)}"
    if "celery.backend_cleanup" in defaults:
        text += (
            " (celery.backend_cleanup is Celery's own: its beat adds it too, because "
            "result_expires is set and the result backend does not expire results by itself)"
        )
    return text


def cannot_start(exc: BaseException, database_url: str | None) -> NoReturn:
    """End beat on a start-up error with one ERROR line that says what is
    wrong and how to fix it; the traceback only at DEBUG.

    Raising into Celery instead prints the traceback twice (its critical log,
    then stderr redirected to the log one fragment per WARNING line: 1,900
    lines for a missing database). SystemExit passes Celery's ``except
    Exception`` and ends the process with status 1; under ``worker -B`` it
    ends the beat child only.
    """
    logger.error("celery-routines beat cannot start: %s", explain_start_error(exc, database_url))
    logger.debug("celery-routines beat start-up error in full", exc_info=exc)
    raise SystemExit(1) from None


def explain_start_error(exc: BaseException, database_url: str | None) -> str:
    """One line for an error met while starting beat or the CLI."""
    if isinstance(exc, SQLAlchemyError):
        return explain_database_error(exc, database_url)
    if isinstance(exc, RoutinesError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
