"""Phase two of a tick: writing down what went out.

The runs published are marked ``sent`` (each with its lost deadline on the
database's clock) and the claimed routines moved on and released, after the
messages. On PostgreSQL both go in one atomic statement; elsewhere a statement
each, so a failure of one undoes neither the other nor the publishing. What is
not yet written stays in the beat's ledger (:mod:`celery_routines.tick.ledger`)
and the next tick writes it before anything else.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from celery_routines.clock import Clock
from celery_routines.config import Settings
from celery_routines.policy.runs import lost_deadline, unstarted_timeout
from celery_routines.store import Published, Store
from celery_routines.tick.ledger import PublishLedger, SentBatch

logger = logging.getLogger("celery_routines.beat")

# A stopping beat tries this many times to write down what it published
# before it gives up (each on a fresh connection: a failed one is discarded).
STOP_WRITE_DOWN_ATTEMPTS = 3


class Bookkeeper:
    """Writes down what the beat published, from its ledger."""

    def __init__(
        self, store: Store, settings: Settings, holder: str, ledger: PublishLedger, clock: Clock
    ) -> None:
        self.store = store
        self.settings = settings
        self.holder = holder
        self.ledger = ledger
        self.clock = clock
        # The database's clock minus the beat's, for run deadlines (set by
        # the engine at each tick).
        self.offset = timedelta(0)

    def mark_published(self) -> None:
        """The ledger's published runs -> ``sent``, oldest batch first."""
        while self.ledger.sent:
            run_ids, sent_at, timeout = self.ledger.sent[0]
            deadline = self._sent_deadline(sent_at, timeout)
            self.store.runs.mark_sent(run_ids, sent_at, deadline_at=deadline)
            self.ledger.marked()

    def mark_batches(self, batches: Sequence[SentBatch]) -> None:
        """Published batches -> ``sent`` (run by ``BackgroundMarker``'s thread:
        it leaves the ledger to the tick's thread)."""
        for run_ids, sent_at, timeout in batches:
            deadline = self._sent_deadline(sent_at, timeout)
            self.store.runs.mark_sent(run_ids, sent_at, deadline_at=deadline)

    def record_published(self, now: datetime) -> None:
        """Write down what went out: runs marked sent, then routines moved on.

        Each is one statement of its own, after the messages: a failure of
        one (a deadlock, a dropped connection, a failover) undoes neither the
        other nor the publishing. What failed stays in the ledger; the next
        tick writes it before doing anything else, and never publishes it again.
        """
        ledger = self.ledger
        if ledger.sent and ledger.advances and self.store.bookkeeping.one_statement:
            self._record_in_one_statement(now)
            return
        self.mark_published()
        if ledger.advances:
            advances = sorted(ledger.advances.values(), key=lambda a: a.routine_id)
            advanced = self.store.routines.advance(advances, self.holder, now)
            ledger.advances.clear()
            self._say_taken_over(len(advances) - advanced)

    def write_down_before_stopping(self) -> None:
        """A stopping beat's ledger (its last bookkeeping failed), written
        before its claims are handed back: else the beat that takes them over
        finds those runs ``pending`` and publishes them again."""
        for attempt in range(1, STOP_WRITE_DOWN_ATTEMPTS + 1):
            if not self.ledger:
                return
            try:
                with self.store.session():  # a fresh connection after a failed one
                    logger.info("stopping: writing down %s", self.ledger.describe())
                    self.record_published(self.clock())
            except Exception:
                if attempt < STOP_WRITE_DOWN_ATTEMPTS:
                    continue
                logger.warning(
                    "stopping: %s not written down; this beat's claims are kept until "
                    "they expire, then the beat taking these routines over sends their "
                    "pending runs again (the worker runs each once)",
                    self.ledger.describe(),
                    exc_info=True,
                )

    def _say_taken_over(self, missed: int) -> None:
        if missed > 0:
            logger.warning(
                "%d routine claim(s) expired before this beat advanced them; "
                "another beat took over (raise routines_lock_ttl if ticks are slow)",
                missed,
            )

    def _record_in_one_statement(self, now: datetime) -> None:
        """PostgreSQL: the runs marked sent and the routines moved on in one
        atomic statement (see :mod:`celery_routines.store.bookkeeping`): a
        failure writes neither, and both stay in the ledger for the next tick."""
        ledger = self.ledger
        runs: list[Published] = []
        for run_ids, sent_at, timeout in ledger.sent:
            # One deadline per batch: its runs went out at one instant.
            deadline = self._sent_deadline(sent_at, timeout)
            runs.extend(Published(run_id, sent_at, deadline) for run_id in run_ids)
        advances = sorted(ledger.advances.values(), key=lambda a: a.routine_id)
        advanced = self.store.bookkeeping.record_published(runs, advances, self.holder, now)
        ledger.sent.clear()
        ledger.advances.clear()
        self._say_taken_over(len(advances) - advanced)

    def _sent_deadline(self, sent_at: datetime, timeout: float | None) -> datetime:
        """A sent run's lost deadline, on the database's clock (``timeout``:
        the routine's own ``run_timeout``, else ``routines_run_timeout``)."""
        waits = unstarted_timeout(timeout or self.settings.run_timeout, self.settings.start_timeout)
        return lost_deadline(sent_at + self.offset, waits)
