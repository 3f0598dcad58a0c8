"""Prometheus metrics served by beat (optional).

Off by default. Set ``routines_metrics_port`` (Celery setting, or the
environment variable ``ROUTINES_METRICS_PORT``) and beat serves ``/metrics``
on that port from a daemon thread; ``routines_metrics_address`` (or
``ROUTINES_METRICS_ADDRESS``) picks the interface, all of them by default.
Needs ``prometheus-client``: ``pip install 'celery-routines[metrics]'``.

Everything is measured in the beat process, from each tick's
:class:`~celery_routines.tick.TickReport`, from the publisher (lateness: send
time minus the window's instant, first attempts only) and from two cheap
counts read at most every ``refresh_every`` seconds (suspended routines, due
routines). What the workers did (outcomes, durations, start lateness, refused
duplicate deliveries, after-run suspensions) is read from the database at the
same refresh (:mod:`celery_routines.observe.run_metrics`).
``routines_duplicates_refused_total`` counts what beat itself refused to send
because another beat had written the window's row first.

Each :class:`RoutineMetrics` has its own ``CollectorRegistry``, so two
schedulers in one process (tests, or beat embedded in a worker) never collide.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any

from celery import Celery

from celery_routines.clock import Clock, utc_now
from celery_routines.config import setting
from celery_routines.errors import ConfigurationError
from celery_routines.observe.run_metrics import RunMetrics
from celery_routines.sending.publish import (
    OutgoingRun,
    PendingErrors,
    Publisher,
)

if TYPE_CHECKING:
    from celery_routines.observe.health import BeatHealth
    from celery_routines.store import Store
    from celery_routines.tick.report import TickReport

logger = logging.getLogger("celery_routines.metrics")

PORT_SETTING = "routines_metrics_port"
ADDRESS_SETTING = "routines_metrics_address"
DEFAULT_ADDRESS = "0.0.0.0"
# The gauges read from the database are refreshed at most this often.
REFRESH_EVERY = 30.0
MISSING = (
    "routines_metrics_port is set but prometheus-client is not installed: "
    "pip install 'celery-routines[metrics]'"
)
# Seconds. A window sent in the first 10 ms is on time; a backlog drain or a
# beat outage shows up in the minutes and hours buckets.
LATENESS_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
    float("inf"),
)  # fmt: skip
TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, float("inf"))


def metrics_port(app: Celery | None) -> int | None:
    """The configured port, or None when metrics are off (the default).

    0 asks the system for a free port (tests read it from ``RoutineMetrics.port``).
    """
    raw = setting(app, PORT_SETTING)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    try:
        port = int(raw)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{PORT_SETTING} must be a port number, got {raw!r}") from None
    if not 0 <= port <= 65535 or isinstance(raw, bool):
        raise ConfigurationError(f"{PORT_SETTING} must be between 0 and 65535, got {raw!r}")
    return port


def metrics_address(app: Celery | None) -> str:
    return str(setting(app, ADDRESS_SETTING) or DEFAULT_ADDRESS)


def _prometheus() -> ModuleType:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(MISSING) from None
    return prometheus_client


class RoutineMetrics:
    """The metrics of one scheduler, in a private registry."""

    def __init__(self, clock: Clock = utc_now, refresh_every: float = REFRESH_EVERY) -> None:
        prom = _prometheus()
        self.clock = clock
        self.refresh_every = timedelta(seconds=refresh_every)
        self._refreshed_at: datetime | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.registry = registry = prom.CollectorRegistry(auto_describe=True)
        counter, gauge, histogram = prom.Counter, prom.Gauge, prom.Histogram
        self.ticks = counter("routines_ticks", "Beat ticks completed.", registry=registry)
        self.tick_errors = counter(
            "routines_tick_errors", "Beat ticks that raised (database or broker down).",
            registry=registry,
        )  # fmt: skip
        self.sent = counter(
            "routines_windows_sent", "Windows sent to the broker (first attempts).",
            registry=registry,
        )  # fmt: skip
        self.retries_sent = counter(
            "routines_retries_sent", "Retries of failed or lost runs sent.", registry=registry
        )
        self.skipped = counter(
            "routines_windows_skipped", "Windows not sent, by reason (the run row's reason).",
            ["reason"], registry=registry,
        )  # fmt: skip
        self.pruned = counter(
            "routines_runs_pruned", "Finished run rows deleted by pruning, by state.",
            ["state"], registry=registry,
        )  # fmt: skip
        self.send_failures = counter(
            "routines_send_failures", "Publishes that failed (recorded and retried).",
            registry=registry,
        )  # fmt: skip
        self.lost = counter(
            "routines_runs_lost", "Runs declared lost (past their deadline).", registry=registry
        )
        self.duplicates = counter(
            "routines_duplicates_refused",
            "Beat side: windows this beat did not send because another beat had written "
            "their run row first (a worker's refused duplicate delivery is counted on the "
            "run row, column duplicates, not here).",
            registry=registry,
        )
        self.replaced = counter(
            "routines_runs_replaced", "Open runs revoked for a newer window (overlap=replace).",
            registry=registry,
        )  # fmt: skip
        self.claimed = gauge(
            "routines_due_claimed", "Routines claimed by the last tick.", registry=registry
        )
        self.more_due = gauge(
            "routines_due_more",
            "1 when the last tick's batch was full: more routines are due than one tick takes.",
            registry=registry,
        )
        self.deferred = gauge(
            "routines_due_deferred",
            "Routines left due by the last tick (gate held, or queued behind an open run).",
            registry=registry,
        )
        self.due = gauge(
            "routines_due_routines",
            "Enabled, unpaused routines whose next window is due (read every refresh).",
            registry=registry,
        )
        self.suspended = gauge(
            "routines_suspended_routines",
            "Routines suspended by a ceiling (read every refresh).",
            registry=registry,
        )
        self.clock_skew = gauge(
            "routines_clock_skew_seconds",
            "The database's clock minus this beat's, measured every tick (claims and run "
            "deadlines follow the database's; windows follow the beat's).",
            registry=registry,
        )
        self.lateness = histogram(
            "routines_lateness_seconds",
            "Send time minus the window's instant, for first attempts.",
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )
        self.tick_duration = histogram(
            "routines_tick_duration_seconds", "Duration of one beat tick.",
            buckets=TICK_BUCKETS, registry=registry,
        )  # fmt: skip
        # What the workers did, read from the database (see run_metrics.py).
        self.runs = RunMetrics(prom, registry)

    # -- feeding -------------------------------------------------------------

    def observe_tick(self, report: TickReport, store: Store | None = None) -> None:
        self.ticks.inc()
        self.sent.inc(report.sent)
        self.retries_sent.inc(report.retries_sent)
        self.send_failures.inc(report.send_failures)
        self.lost.inc(report.lost)
        self.duplicates.inc(report.conflicts)
        self.replaced.inc(report.replaced)
        for reason, count in report.skipped_by_reason.items():
            self.skipped.labels(reason=reason).inc(count)
        self.claimed.set(report.claimed)
        self.more_due.set(1 if report.more_due else 0)
        self.deferred.set(report.deferred + report.queued)
        self.tick_duration.observe(report.duration)
        if store is not None:
            self.refresh(store)

    def observe_pruned(self, deleted: dict[str, int]) -> None:
        for state, count in deleted.items():
            self.pruned.labels(state=state).inc(count)

    def observe_tick_error(self) -> None:
        self.tick_errors.inc()

    def observe_sent(self, run: OutgoingRun, sent_at: datetime) -> None:
        if run.attempt == 1:
            self.lateness.observe(max((sent_at - run.window).total_seconds(), 0.0))

    def refresh(self, store: Store, force: bool = False) -> None:
        """Read the database gauges, at most once per ``refresh_every``."""
        now = self.clock()
        # A clock stepped backwards refreshes at once rather than going stale.
        if (
            not force
            and self._refreshed_at is not None
            and timedelta(0) <= now - self._refreshed_at < self.refresh_every
        ):
            return
        self._refreshed_at = now
        try:
            suspended, due = store.admin.routine_counts(now)
        except Exception as exc:  # a metric must never stop a tick
            logger.warning("could not read the routine counts for metrics: %s", exc)
            return
        self.suspended.set(suspended)
        self.due.set(due)
        try:
            self.runs.read(store)
        except Exception as exc:
            logger.warning("could not read the run metrics: %s", exc)

    # -- serving -------------------------------------------------------------

    def serve(
        self, port: int, address: str = DEFAULT_ADDRESS, health: BeatHealth | None = None
    ) -> int:
        """Serve ``/metrics`` from a daemon thread, and beat's ``/livez`` and
        ``/readyz`` with ``health``; returns the bound port."""
        prom = _prometheus()
        if health is not None:
            from celery_routines.observe.health import ProbeServer, probe_handler

            handler = probe_handler(health, prom.MetricsHandler.factory(self.registry))
            probes = ProbeServer(handler, address, port, PORT_SETTING, "metrics")
            self._server, self._thread = probes.server, probes.thread
            logger.info("celery-routines metrics and probes on http://%s:%d", address, probes.port)
            return probes.port
        try:
            self._server, self._thread = prom.start_http_server(
                port, addr=address, registry=self.registry
            )
        except OSError as exc:
            raise ConfigurationError(
                f"{PORT_SETTING}: cannot serve metrics on {address}:{port}: {exc.strerror or exc}"
            ) from exc
        bound = int(self._server.server_port)
        logger.info("celery-routines metrics on http://%s:%d/metrics", address, bound)
        return bound

    @property
    def port(self) -> int | None:
        return int(self._server.server_port) if self._server is not None else None

    def render(self) -> bytes:
        return bytes(_prometheus().generate_latest(self.registry))

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()  # shutdown() waited for the serving loop to end
        self._thread = None


class MeasuredPublisher(Publisher):
    """A publisher that records each successful send's lateness."""

    def __init__(self, inner: Publisher, metrics: RoutineMetrics, clock: Clock) -> None:
        self.inner = inner
        self.metrics = metrics
        self.clock = clock
        # The tick engine revokes through the publisher's app (overlap=replace).
        self.app = getattr(inner, "app", None)

    def publish(self, run: OutgoingRun) -> None:
        self.inner.publish(run)
        self.metrics.observe_sent(run, self.clock())

    @property
    def in_background(self) -> bool:
        return self.inner.in_background

    def publish_many(self, runs: Sequence[OutgoingRun]) -> list[Exception | None]:
        return self.begin_publish_many(runs)()

    def begin_publish_many(self, runs: Sequence[OutgoingRun]) -> PendingErrors:
        pending = self.inner.begin_publish_many(runs)

        def observed() -> list[Exception | None]:
            errors = pending()
            sent_at = self.clock()
            for run, error in zip(runs, errors, strict=True):
                if error is None:
                    self.metrics.observe_sent(run, sent_at)
            return errors

        return observed

    def close(self) -> None:
        self.inner.close()


def metrics_for(
    app: Celery, clock: Clock, health: BeatHealth | None = None
) -> RoutineMetrics | None:
    """A serving ``RoutineMetrics`` when the port is set (with beat's probes
    beside ``/metrics`` when ``health`` is given), else None."""
    port = metrics_port(app)
    if port is None:
        return None
    metrics = RoutineMetrics(clock)
    metrics.serve(port, metrics_address(app), health)
    return metrics
