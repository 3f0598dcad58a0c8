"""``celery_routines.Scheduler``: a thin adapter between Celery's beat service
and the tick engine.

Celery's stock heap loop asks "which entry is due" in memory and spins before
each due entry; this scheduler overrides ``tick`` to ask the database instead
and sleeps until the next due instant.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from types import FrameType
from typing import Any, NoReturn

from celery import Celery
from celery.beat import Scheduler as CeleryScheduler
from sqlalchemy.exc import SQLAlchemyError

from .clock import Clock, utc_now
from .config import Settings, settings_from
from .errors import RoutinesError
from .extras import check_extras
from .observe.events import RoutineEvents
from .observe.health import BeatHealth, ProbeServer, serve_health, store_checker
from .observe.metrics import MeasuredPublisher, RoutineMetrics, metrics_for
from .redeclare import CodeDeclarations, written_line
from .sending.gate import Gate, OpenGate, RedisGate
from .sending.offload import beats_publisher
from .sending.publish import Publisher
from .sending.redis_connect import describe as describe_redis
from .store import Store
from .store.engine import explain_database_error, safe_url
from .store.migrate import HEAD_REVISION
from .tick.backoff import TickBackoff, ledger_deadline
from .tick.engine import TickEngine
from .tick.heartbeat import BeatHeartbeat, heartbeat_for
from .tick.prune import Pruner
from .tick.report import TickReport

logger = logging.getLogger("celery_routines.beat")

# A beat off the database's clock by more than this says so (at start, then this often).
SKEW_WARNING_SECONDS = 1.0
SKEW_WARNING_EVERY = 300.0
# A pooled connection is pinged at checkout only after sitting idle this much
# longer than beat's longest sleep (routines_refresh_seconds): an idle tick is
# then its probe alone, one round trip, where a ping at every checkout made it
# two. A connection cut meanwhile (a restart, a failover) fails the tick's
# first statement; that tick is tried again at once on a fresh connection.
PING_MARGIN_SECONDS = 1.0
# Wake a little after the due instant, not before it: waking early only to find
# nothing due is the spin the stock loop suffers from.
WAKE_SLACK = 0.005


class Scheduler(CeleryScheduler):
    """Database-backed beat scheduler; see the README for settings."""

    def __init__(self, app: Celery, *args: Any, clock: Clock | None = None, **kwargs: Any) -> None:
        self._clock: Clock = clock or utc_now
        # Claims and run deadlines follow the database's clock; an injected
        # clock (tests) stands in for both.
        self._arbitrate_on_database = clock is None
        self._skew_said: float | None = None
        self._engine: TickEngine | None = None
        self._store: Store | None = None
        self._declarations: CodeDeclarations | None = None
        self._gate: Gate | None = None
        self._closed = False
        self._backoff = TickBackoff(logger)
        self._in_tick = False
        self._stop_requested: float | None = None
        self._stopped_by: str | None = None  # the signal that stopped beat, for the last line
        self._wrapped_signals: dict[int, tuple[Any, Any]] = {}  # signum: (Celery's, ours)
        try:
            self.settings: Settings = settings_from(app)
        except RoutinesError as exc:
            cannot_start(exc, None)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # The declaration stamp of this process's code unless routines_code_version
        # says otherwise: the instant it was loaded (the newest start wins).
        self._loaded_at = self._clock().isoformat()
        self._pruner: Pruner | None = None
        self._beat_heartbeat: BeatHeartbeat | None = None
        self.last_report: TickReport | None = None
        # Served from setup_schedule, so the banner's lazy instance serves nothing.
        self.metrics: RoutineMetrics | None = None
        self.health: BeatHealth | None = None
        self._health_server: ProbeServer | None = None
        super().__init__(app, *args, **kwargs)

    # Celery calls this from __init__ unless lazy=True (the banner's instance),
    # so the lazy instance never touches the database.
    def setup_schedule(self) -> None:
        try:
            self._set_up()
        except Exception as exc:
            cannot_start(exc, self.settings.database_url)

    def _set_up(self) -> None:
        # A path chosen without its extra ends beat here, in one line naming
        # the extra, not later in a background process (a publish, a fork).
        check_extras(self.app, self.settings)
        store = Store.from_settings(
            self.settings, ping_after_idle=self.settings.refresh_seconds + PING_MARGIN_SECONDS
        )
        store.migrate()
        self._declarations = CodeDeclarations(
            self.app,
            self.settings,
            store,
            self._clock,
            stamp=self.settings.code_version or self._loaded_at,
            holder=self.holder,
        )
        names = self._declarations.declare()
        logger.info(
            "celery-routines: %s", written_line(self.app, names, self.settings.database_url)
        )
        self._store = store
        self._beat_heartbeat = heartbeat_for(store.beats, self.holder, self._clock, self)
        self._serve_health(store)
        if self.metrics is None:
            self.metrics = metrics_for(self.app, self._clock, self.health)
        if self._arbitrate_on_database:
            self._say_skew((store.db_now() - utc_now()).total_seconds())
        self._gate = (
            RedisGate(
                self.settings.redis_url,
                self.holder,
                self.settings.lock_ttl,
                sentinel_master=self.settings.redis_sentinel_master,
            )
            if self.settings.redis_url
            else OpenGate()
        )

    @property
    def engine(self) -> TickEngine:
        if self._engine is None:
            if self._store is None:
                self.setup_schedule()
            assert self._store is not None and self._gate is not None
            publisher: Publisher = beats_publisher(self.app, self.settings)
            if self.metrics is not None:
                publisher = MeasuredPublisher(publisher, self.metrics, self._clock)
            self._engine = TickEngine(
                self._store,
                publisher,
                self._gate,
                self.settings,
                self.holder,
                self._clock,
                events=RoutineEvents(self.app, hostname=self.holder, store=self._store),
                arbitrate_on_database=self._arbitrate_on_database,
            )
        return self._engine

    @property
    def store(self) -> Store:
        return self.engine.store

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass over the database; returns the seconds to sleep."""
        self._wrap_stop_signals()
        self._in_tick = True
        try:
            engine = self.engine
            if self._declarations is not None:
                self._declarations.keep()  # the code's routines, if the store lost them
            report = engine.tick()
        except Exception as exc:
            self._in_tick = False
            if self._declarations is not None:
                self._declarations.tick_failed(exc)
            if self.health is not None:
                self.health.tick_finished(ok=False)
            self._stop_if_requested()
            if self.metrics is not None:
                self.metrics.observe_tick_error()
            ledger = self._engine.ledger if self._engine is not None else None
            longest = min(self.max_interval, ledger_deadline(bool(ledger), self.settings.lock_ttl))
            return self._backoff.failed(exc, longest, ledger.describe() if ledger else None)
        self._in_tick = False
        if self.health is not None:
            self.health.tick_finished(ok=True)
        self._stop_if_requested()
        self._backoff.succeeded()
        self.last_report = report
        self._watch_skew()
        if self._beat_heartbeat is not None:  # the row of the panel's Beats page
            self._beat_heartbeat.tick_finished(report.duration)
        if self.metrics is not None:
            self.metrics.observe_tick(report, self._store)
        self._prune()
        if report.more_due:
            return 0.0
        # Rows changed outside the code are seen within routines_refresh_seconds.
        longest = min(float(self.max_interval), self.settings.refresh_seconds)
        if report.next_wakeup is None:
            return longest
        until = (report.next_wakeup - self._clock()).total_seconds() + WAKE_SLACK
        return min(max(until, WAKE_SLACK), longest)

    def _serve_health(self, store: Store) -> None:
        """Beat's probes (observe/health.py): on ``routines_health_port`` when
        set, and beside ``/metrics`` on the metrics port."""
        if self.health is None:
            declared = self._declarations.readiness_problem if self._declarations else None
            check = store_checker(store, HEAD_REVISION, declared)
            self.health = BeatHealth(float(self.max_interval), check)
        port = self.settings.health_port
        if port is not None and self._health_server is None:
            self._health_server = serve_health(self.health, port, self.settings.health_address)

    def _prune(self) -> None:
        """One batch of the run history's pruning, at most once a minute."""
        if self._store is None:
            return
        if self._pruner is None:
            settings = self.settings
            self._pruner = Pruner(
                self._store,
                settings.keep_runs_days,
                settings.prune_batch,
                settings.timezone,
                self.metrics,
            )
        self._pruner.maybe_prune(self._clock())

    def _watch_skew(self) -> None:
        """The database's clock minus ours, as the tick measured it: a gauge,
        and a warning above a second (at start, then every few minutes)."""
        engine = self._engine
        if engine is None or not (engine.arbitrate_on_database or engine.arbiter):
            return
        self._say_skew(engine.offset.total_seconds())

    def _say_skew(self, skew: float) -> None:
        if self.metrics is not None:
            self.metrics.clock_skew.set(skew)
        said, now = self._skew_said, time.monotonic()
        if said is not None and now - said < SKEW_WARNING_EVERY:
            return
        if abs(skew) > SKEW_WARNING_SECONDS:
            self._skew_said = now
            logger.warning(
                "this beat's clock is %.1f s %s the database's: windows fire by this beat's "
                "clock (that much %s), claims and run deadlines by the database's; keep beat "
                "hosts on NTP",
                abs(skew),
                "behind" if skew > 0 else "ahead of",
                "late" if skew > 0 else "early",
            )
        elif said is None:
            self._skew_said = now
            logger.info("this beat's clock is %.3f s off the database's", skew)

    # -- stopping (SIGTERM/SIGINT) ---------------------------------------------

    def _wrap_stop_signals(self) -> None:
        """Celery's beat answers SIGTERM/SIGINT by closing the scheduler and
        raising SystemExit from the signal handler, wherever the tick is: it
        could leave committed runs unpublished until another beat's claims
        expired. Wrapped, a signal that arrives during a tick only asks it to
        stop; the tick publishes what it committed (for at most
        ``STOP_GRACE_SECONDS``), writes it down, and beat stops after it.
        Between ticks Celery's own handler runs as before."""
        if self._wrapped_signals or threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(signum)
            ours = self._stop_handler(previous)
            signal.signal(signum, ours)
            self._wrapped_signals[signum] = (previous, ours)

    def _unwrap_stop_signals(self) -> None:
        # A process that makes scheduler after scheduler (an embedder, a test
        # suite) would otherwise stack one closed scheduler's handler on
        # another: a signal would run through every one of them.
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, (previous, ours) in self._wrapped_signals.items():
            if signal.getsignal(signum) is ours:  # nobody wrapped ours since
                signal.signal(signum, previous)
        self._wrapped_signals.clear()

    def _stop_handler(self, previous: Any) -> Any:
        def handler(signum: int, frame: FrameType | None) -> None:
            if self._in_tick and self._stop_requested is None:
                self._stop_requested = time.monotonic()
                if self._engine is not None:
                    self._engine.stopping = self._stop_requested
                logger.info(
                    "beat told to stop (%s) during a tick: publishing what it committed, "
                    "then stopping",
                    signal.Signals(signum).name,
                )
                return
            if previous == signal.SIG_IGN:
                return
            self._stopped_by = signal.Signals(signum).name
            if callable(previous):
                previous(signum, frame)  # Celery's: closes the scheduler, SystemExit
            self.close()
            raise SystemExit(0)

        return handler

    def _stop_if_requested(self) -> None:
        if self._stop_requested is None:
            return
        logger.info(
            "beat stopping after its tick (%.1f s after it was told to)",
            time.monotonic() - self._stop_requested,
        )
        self.close()
        raise SystemExit(0)

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
        self._unwrap_stop_signals()
        if self.metrics is not None:
            self.metrics.close()
        if self._health_server is not None:
            self._health_server.close()
        if self._engine is not None:
            self._engine.wind_down()  # no claim taken after they are released
        self._release_claims()
        if self._gate is not None:
            self._gate.close()
        if self._engine is not None:
            self._engine.publisher.close()
            self._engine.events.close()
        if self._store is not None:
            self._store.dispose()
        super().close()

    def _release_claims(self) -> None:
        """A beat that stops cleanly hands its claims back, so the others
        take its routines over at once instead of after ``routines_lock_ttl``,
        and leaves the Beats page; its last line says why, and what it handed back."""
        if self._store is None:
            return
        if self._beat_heartbeat is not None:
            self._beat_heartbeat.stopped()
        why = f" ({self._stopped_by})" if self._stopped_by else ""
        if self._engine is not None and self._engine.ledger:
            # Handed back, these routines would be taken over at once and
            # their pending runs, published by this beat, sent again.
            logger.warning(
                "beat stopped%s: not releasing its claims: %s are not written down; "
                "the claims expire after routines_lock_ttl",
                why,
                self._engine.ledger.describe(),
            )
            return
        try:
            released = self._store.routines.release_claims(self.holder)
        except Exception:
            logger.warning(
                "beat stopping%s: could not release its claims; they expire after "
                "routines_lock_ttl (%.0f s)",
                why,
                self.settings.lock_ttl,
                exc_info=True,
            )
            return
        logger.info(
            "beat stopped%s: handed %d routine claim(s) back to the other beats",
            why,
            released,
        )

    @property
    def info(self) -> str:
        url, master = self.settings.redis_url, self.settings.redis_sentinel_master
        gate = f"redis ({describe_redis(url, master)})" if url else "database only"
        processes = self.settings.publish_processes
        where = f" in {processes} publishing process(es)" if processes else ""
        return (
            # Celery's "maxinterval" line above only caps the sleep: this is
            # what wakes this beat.
            f"    . wake-up -> at each due instant, and every "
            f"{self.settings.refresh_seconds:g} s (routines_refresh_seconds) to see changes\n"
            f"    . routines db -> {safe_url(self.settings.database_url)}\n"
            f"    . idempotency gate -> {gate}\n"
            f"    . publish -> {self.settings.publish}{where}"
        )


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
