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
from celery_routines.policy.runs import lost_deadline
from celery_routines.store import Probe, Published, Store
from celery_routines.tick.ahead import Ahead, Batch
from celery_routines.tick.ledger import Unrecorded
from celery_routines.tick.marking import SentBatch
from celery_routines.tick.refresh import Refresher
from celery_routines.tick.report import TickReport

logger = logging.getLogger("celery_routines.beat")


class Recording:
    """What the engine provides to this half."""

    store: Store
    settings: Settings
    holder: str
    ledger: Unrecorded
    # The database's clock minus the beat's, for run deadlines.
    offset: timedelta
    ahead: Ahead | None
    # The bookkeeping handed over to the batch in preparation, if any.
    _handed: Unrecorded | None = None
    refresher: Refresher
    clock: Clock

    def _publish(self, batch: Batch, now: datetime, report: TickReport) -> None: ...

    def settle(self) -> None:
        """Beat stopping, before its claims are released: publish the batch
        in preparation, as a tick told to stop does (within the same grace,
        the rest left ``pending`` for the next holder); then write down
        whatever this beat published and has not (the next holder would
        otherwise send it again)."""
        try:
            batch = self._take_prepared()
            if batch is not None:
                report = TickReport()
                with self.store.session():
                    self._publish(batch, self.clock(), report)
                logger.info("stopping: sent %d run(s) of the batch written last", report.sent)
        except Exception:
            logger.warning("stopping: the batch written last was not all sent", exc_info=True)
        if self.ledger:
            try:
                with self.store.session():
                    self._write_ledger_first(self.clock())
            except Exception:
                logger.warning("stopping: %s not written down", self.ledger.describe())

    def _take_prepared(self) -> Batch | None:
        """The burst's next batch, written meanwhile (None if none was
        started); the bookkeeping handed over to it back in the ledger unless
        it was written, even when its preparation failed."""
        if self.ahead is None:
            return None
        try:
            return self.ahead.take()
        finally:
            handed, self._handed = self._handed, None
            if handed is not None:
                self.ledger.take_back(handed)

    def _write_ledger_first(self, now: datetime) -> None:
        logger.info("writing down %s before anything else", self.ledger.describe())
        self._record_published(now)

    def _only_publishing(self, probe: Probe, now: datetime) -> bool:
        """A burst tick with nothing to do but publish the batch written
        meanwhile: the previous batch's bookkeeping may wait for the next
        batch's preparation (no claim reads before it). Anything else this
        tick would read or plan from is left to the written ledger."""
        return not (
            probe.unscheduled
            or probe.changed
            or self.refresher.baselining
            or due(probe.retry_at, now)
            or due(probe.deadline, now)
        )

    def _mark_published(self, ledger: Unrecorded) -> None:
        """The ledger's published runs -> ``sent``, oldest batch first."""
        while ledger.sent:
            run_ids, sent_at, timeout = ledger.sent[0]
            deadline = self._sent_deadline(sent_at, timeout)
            self.store.runs.mark_sent(run_ids, sent_at, deadline_at=deadline)
            ledger.marked()

    def _mark_batches(self, batches: Sequence[SentBatch]) -> None:
        """Published batches -> ``sent`` (run by ``MarkingBehind``'s thread:
        it leaves the ledger to the tick's thread)."""
        for run_ids, sent_at, timeout in batches:
            deadline = self._sent_deadline(sent_at, timeout)
            self.store.runs.mark_sent(run_ids, sent_at, deadline_at=deadline)

    def _record_published(self, now: datetime, ledger: Unrecorded | None = None) -> None:
        """Write down what went out: runs marked sent, then routines moved on.

        Each is one statement of its own, after the messages: a failure of
        one (a deadlock, a dropped connection, a failover) undoes neither the
        other nor the publishing. What failed stays in the ledger; the next
        tick writes it before doing anything else, and never publishes it again.
        ``ledger``: one handed over to a burst's next batch (tick/ahead.py).
        """
        ledger = self.ledger if ledger is None else ledger
        if ledger.sent and ledger.advances and self.store.bookkeeping.one_statement:
            self._record_in_one_statement(now, ledger)
            return
        self._mark_published(ledger)
        if ledger.advances:
            advances = sorted(ledger.advances.values(), key=lambda a: a.routine_id)
            advanced = self.store.routines.advance(advances, self.holder, now)
            ledger.advances.clear()
            self._say_taken_over(len(advances) - advanced)

    def _say_taken_over(self, missed: int) -> None:
        if missed > 0:
            logger.warning(
                "%d routine claim(s) expired before this beat advanced them; "
                "another beat took over (raise routines_lock_ttl if ticks are slow)",
                missed,
            )

    def _record_in_one_statement(self, now: datetime, ledger: Unrecorded) -> None:
        """PostgreSQL: the runs marked sent and the routines moved on in one
        atomic statement (see :mod:`celery_routines.store.bookkeeping`): a
        failure writes neither, and both stay in the ledger for the next tick."""
        runs = []
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
        return lost_deadline(sent_at + self.offset, timeout or self.settings.run_timeout)


def due(instant: datetime | None, now: datetime) -> bool:
    return instant is not None and instant <= now
