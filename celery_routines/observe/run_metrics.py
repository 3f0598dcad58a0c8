"""Run metrics from every worker, exported by beat (issue 18).

Workers run bodies in many processes (prefork children, several hosts), so a
counter kept in a worker's memory is split across processes and lost with
each of them. Everything a worker does to a run is already written to the
database: the outcome and its instants on the run row, and what no run
column dates (a refused duplicate delivery, an after-run suspension) as a
row of ``routine_worker_events``. Beat reads what is new since its last read
in one read transaction of two range scans (the runs finished since then,
by ``ix_routine_runs_finished``; the events past the last id it saw) and
feeds its Prometheus counters and histograms, labelled by routine.

Runs are read up to ``SETTLE_SECONDS`` behind the database's clock: a
worker stamps ``finished_at`` on its own clock and commits a moment later,
so a run is read once if its worker's clock is within that of the
database's. Counters start at beat's start (Prometheus' usual reset), and
every beat exports the same totals: aggregate with ``max``, not ``sum``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING

from celery_routines.store.run_metrics import DUPLICATE, SUSPENDED

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from celery_routines.store import Store

logger = logging.getLogger("celery_routines.metrics")

SETTLE_SECONDS = 30.0
DURATION_BUCKETS = (
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, float("inf"),
)  # fmt: skip
START_BUCKETS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0, float("inf"),
)  # fmt: skip


class RunMetrics:
    """The workers' side of the runs, read from the database by beat."""

    def __init__(
        self, prom: ModuleType, registry: CollectorRegistry, settle: float = SETTLE_SECONDS
    ) -> None:
        self.settle = timedelta(seconds=settle)
        self._after: datetime | None = None
        self._last_event: int | None = None
        self.outcomes = prom.Counter(
            "routines_run_outcomes",
            "Runs finished, by routine and final state (succeeded, failed, retrying, lost), "
            "as recorded by every worker (read from the database).",
            ["routine", "state"], registry=registry,
        )  # fmt: skip
        self.duration = prom.Histogram(
            "routines_run_duration_seconds",
            "Body duration of finished runs (finished_at - started_at), by routine.",
            ["routine"], buckets=DURATION_BUCKETS, registry=registry,
        )  # fmt: skip
        self.start_lateness = prom.Histogram(
            "routines_run_start_lateness_seconds",
            "Body start minus the window's instant (send lateness plus queueing), by routine.",
            ["routine"], buckets=START_BUCKETS, registry=registry,
        )  # fmt: skip
        self.refused = prom.Counter(
            "routines_worker_duplicates_refused",
            "Deliveries a worker's claim refused because the run had already started or "
            "finished (the body did not run again), by routine.",
            ["routine"], registry=registry,
        )  # fmt: skip
        self.suspensions = prom.Counter(
            "routines_after_run_suspensions",
            "Routines suspended by a worker's after-run ceiling check, by routine.",
            ["routine"], registry=registry,
        )  # fmt: skip

    def read(self, store: Store) -> None:
        """Feed what is new since the last read (the first read only sets the
        starting point: counters start at zero when beat starts)."""
        until = store.db_now() - self.settle
        if self._after is None or self._last_event is None:
            self._after, self._last_event = until, store.run_metrics.last_event_id()
            return
        if until <= self._after:
            return  # the database's clock stepped back: nothing new to read yet
        finished, events = store.run_metrics.since(self._after, until, self._last_event)
        self._after = until
        for run in finished:
            self.outcomes.labels(routine=run.routine, state=run.state).inc()
            if run.started_at is not None:
                self.duration.labels(routine=run.routine).observe(
                    max((run.finished_at - run.started_at).total_seconds(), 0.0)
                )
                self.start_lateness.labels(routine=run.routine).observe(
                    max((run.started_at - run.scheduled_for).total_seconds(), 0.0)
                )
        for event in events:
            self._last_event = max(self._last_event, event.id)
            if event.kind == DUPLICATE:
                self.refused.labels(routine=event.routine).inc()
            elif event.kind == SUSPENDED:
                self.suspensions.labels(routine=event.routine).inc()
