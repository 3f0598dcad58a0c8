"""Pruning the run history: which runs may go, and how much per pass.

A finished run older than ``routines_keep_runs_days`` is deleted, unless it is
its routine's newest run or a ceiling of its routine still counts it: such a
routine's cut-off is the start of its longest current ceiling period (a
monthly ceiling keeps the month), so the effective retention is at least the
longest ceiling period in use. The workers' events (refused duplicates,
suspensions: what the metrics count) older than ``routines_keep_runs_days``
go too. Beat prunes one batch of at most ``routines_prune_batch`` rows of each
per pass, one pass a minute at most.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

from celery_routines.errors import ScheduleError
from celery_routines.policy.ceilings import parse_ceilings
from celery_routines.policy.periods import period_bounds
from celery_routines.store import Store
from celery_routines.store.beats import KEEP_BEATS
from celery_routines.store.faults import cause_of, traceback_unless_unreachable

logger = logging.getLogger("celery_routines.beat")

# Beat prunes at most this often (seconds of the monotonic clock).
PRUNE_EVERY = 60.0


def ceiling_cutoffs(store: Store, now: datetime, default_zone: str) -> dict[int, datetime]:
    """Each routine with a ceiling: the start of its longest current period."""
    cutoffs: dict[int, datetime] = {}
    for routine_id, ceiling_json, zone in store.prune.ceilings():
        try:
            ceilings = parse_ceilings(ceiling_json)
            starts = [period_bounds(now, c.per, zone or default_zone)[0] for c in ceilings]
        except ScheduleError:
            # An unreadable ceiling: keep everything it might count.
            starts = [datetime.min.replace(tzinfo=now.tzinfo)]
        if starts:
            cutoffs[routine_id] = min(starts)
    return cutoffs


def prune_once(
    store: Store,
    now: datetime,
    keep: timedelta,
    limit: int,
    default_zone: str,
    *,
    dry_run: bool = False,
) -> tuple[datetime, dict[int, datetime], dict[str, int]]:
    """One pass (or, ``dry_run``, the count of everything prunable):
    ``(cutoff, per-routine cut-offs, rows by state)``."""
    cutoff = now - keep
    cutoffs = ceiling_cutoffs(store, now, default_zone)
    if dry_run:
        return cutoff, cutoffs, store.prune.count(cutoff, cutoffs)
    return cutoff, cutoffs, store.prune.prune(cutoff, cutoffs, limit)


class Pruner:
    """Beat's pruning: one batch at most once a minute, never in the first
    minute (a starting beat has other work), never raising into the tick."""

    def __init__(
        self,
        store: Store,
        keep_days: float,
        batch: int,
        default_zone: str,
        metrics: object = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.monotonic = monotonic
        self.store = store
        self.keep = timedelta(days=keep_days)
        self.batch = batch
        self.default_zone = default_zone
        self.metrics = metrics
        self.next_pass = monotonic() + PRUNE_EVERY
        self.total: Counter[str] = Counter()

    def maybe_prune(self, now: datetime) -> dict[str, int] | None:
        if self.monotonic() < self.next_pass:
            return None
        self.next_pass = self.monotonic() + PRUNE_EVERY
        try:
            _, _, deleted = prune_once(self.store, now, self.keep, self.batch, self.default_zone)
            events = self.store.run_metrics.prune_events(now - self.keep, self.batch)
            # Heartbeat rows of beats gone for a day (issue 33).
            self.store.beats.prune(now - KEEP_BEATS)
        except Exception as exc:
            logger.warning(
                "pruning the run history failed (%s); trying again in a minute",
                cause_of(exc),
                exc_info=traceback_unless_unreachable(exc),
            )
            return None
        if deleted:
            self.total.update(deleted)
            counted = getattr(self.metrics, "observe_pruned", None)
            if counted is not None:
                counted(deleted)
            logger.info(
                "pruned %d finished run(s) older than %s (%s)",
                sum(deleted.values()),
                self.keep,
                ", ".join(f"{n} {state}" for state, n in sorted(deleted.items())),
            )
        if events:
            logger.info("pruned %d worker event(s) older than %s", events, self.keep)
        return deleted
