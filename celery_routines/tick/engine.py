"""One beat tick: read, decide, write, then send.

*read*: claim the due routines and, in as few queries as there are kinds of
fact, what deciding needs (ceiling usage, open runs, a dead beat's rows);
*decide*: :mod:`celery_routines.policy.decide`, pure; *write*: the decisions'
rows, claims, suspensions and deferrals in the tick's one transaction
(:class:`~celery_routines.tick.write.RunWriter`); *send*: after the commit
(:class:`~celery_routines.tick.send.WindowSender`), then mark the runs sent and
move the routines on (:class:`~celery_routines.tick.recording.Bookkeeper`,
from the :mod:`~celery_routines.tick.ledger`).
A burst's next batch is written while one publishes (:mod:`~celery_routines.tick.ahead`);
lost runs and retries are swept by :mod:`~celery_routines.tick.sweeps`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from celery_routines.clock import Clock
from celery_routines.config import Settings
from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.observe.events import Events, NoEvents
from celery_routines.policy import decide
from celery_routines.policy.catch_up import FirePlan
from celery_routines.policy.decide import Claimed, Decision, Facts, SharedAnswers
from celery_routines.policy.routine_rows import from_columns
from celery_routines.schedules.base import Schedule, first_window, is_never
from celery_routines.schedules.jitter import send_instant
from celery_routines.schedules.parse import schedule_of
from celery_routines.schedules.zones import load_zone
from celery_routines.sending.gate import Gate
from celery_routines.sending.publish import Publisher
from celery_routines.sending.revoke import CeleryRevoker, NoRevoker, Revoker
from celery_routines.store import Advance, Probe, RoutineRecord, Store
from celery_routines.tick.ahead import BatchPreparer, WrittenBatch
from celery_routines.tick.collection import collection_deferred
from celery_routines.tick.contention import HeldElsewhere
from celery_routines.tick.ledger import PublishLedger
from celery_routines.tick.marking import BackgroundMarker, InlineMarker
from celery_routines.tick.recording import Bookkeeper
from celery_routines.tick.refresh import Refresher
from celery_routines.tick.report import TickReport
from celery_routines.tick.send import CLAIM_TRUSTED_SHARE, WindowSender
from celery_routines.tick.sweeps import Sweeps
from celery_routines.tick.write import RunWriter

logger = logging.getLogger("celery_routines.beat")

# A slow beat's claims shrink to no fewer routines than this per tick.
MIN_CLAIM_LIMIT = 10


class TickEngine:
    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        gate: Gate,
        settings: Settings,
        holder: str,
        clock: Clock,
        revoker: Revoker | None = None,
        events: Events | None = None,
        arbiter: Clock | None = None,
        arbitrate_on_database: bool = False,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.gate = gate
        self.settings = settings
        self.holder = holder
        self.clock = clock
        if revoker is None:
            app = getattr(publisher, "app", None)
            revoker = CeleryRevoker(app) if app is not None else NoRevoker()
        self.revoker = revoker
        # Skips, suspensions and lost runs also go out as `routine-*` events.
        self.events: Events = events or NoEvents()
        self.sweeps = Sweeps(store, publisher, settings, self.events, clock)
        self.refresher = Refresher(store, settings, holder, self.events)
        # Due routines other beats' open claims hold: waited out, not spun on.
        self.held_elsewhere = HeldElsewhere()
        # Window keys, plans and deadlines shared by a burst's routines.
        self.answers = SharedAnswers()
        # What this beat published and has not yet written down, and who
        # writes it down.
        self.ledger = PublishLedger()
        self.bookkeeper = Bookkeeper(store, settings, holder, self.ledger, clock)
        on_postgres = store.engine.dialect.name == "postgresql"
        # PostgreSQL: a published chunk is marked sent on another thread
        # while the next is published (tick/marking.py).
        self.marking = (
            BackgroundMarker(self.ledger, self.bookkeeper.mark_batches) if on_postgres else None
        )
        # The decisions written in the tick's transaction; the runs sent after it.
        self.writer = RunWriter(store, gate, holder, self.revoker, self.events)
        self.sender = WindowSender(
            store,
            publisher,
            settings,
            holder,
            clock,
            self.events,
            self.ledger,
            self.marking or InlineMarker(self.bookkeeper.mark_published),
        )
        # A burst's next batch written while this one publishes (PostgreSQL).
        self.ahead = BatchPreparer() if on_postgres else None
        # The most routines one tick claims: routines_batch_size, less while
        # ticks take too much of routines_lock_ttl (see _fit_claims_to_ttl).
        self.claim_limit = settings.batch_size
        # The clock claims and run deadlines are written and compared on, so
        # a beat whose clock is off neither holds claims longer nor declares
        # runs lost early; windows stay on ``clock``. In production it is the
        # database's (``arbitrate_on_database``: read by the probe itself, no
        # extra statement); tests may inject one (``arbiter``). Neither:
        # ``clock`` is both.
        self.arbiter = arbiter
        self.arbitrate_on_database = arbitrate_on_database
        # The arbiter's clock minus ours, measured at the start of each tick.
        self.offset = timedelta(0)

    def tick(self) -> TickReport:
        """One tick on one database connection.

        A probe (one SELECT) says what there is to do; an idle tick ends
        there. Otherwise everything up to writing the run rows is one
        transaction (claims and rows commit together, before any message goes
        out), then the messages, then marking them sent, advancing the
        routines and probing for the next wake-up in a second.
        """
        started = time.monotonic()
        report = TickReport()
        now = self.clock()
        with self.store.session():
            if self.arbiter is not None:
                self._set_offset(self.arbiter() - now)
            if self.ledger:
                logger.info("writing down %s before anything else", self.ledger.describe())
                self.bookkeeper.record_published(now)
            # The batch the previous tick of a burst claimed and wrote while it
            # published (tick/ahead.py): published by this one.
            prepared = self.ahead.take() if self.ahead is not None else None
            probe = self.store.probe(
                now,
                self.holder,
                now + self.offset,
                on_database_clock=self.arbitrate_on_database,
                refresh=self.refresher.due(now),
            )
            if probe.clock is not None:
                self._set_offset(probe.clock - now)
            claimed_at = None
            if prepared is not None or self._work(probe, now):
                with collection_deferred():
                    self._act(probe, now, report, prepared)
                claimed_at = now
                if report.more_due:
                    # More is due than one tick claims: beat ticks again at
                    # once, and that tick's own probe answers (a burst's
                    # ticks probed twice in a row). The wait for routines
                    # held elsewhere is still counted (a claim resets it).
                    self.held_elsewhere.retry_at(probe.window, claimed_at, report.claimed, now)
                    report.next_wakeup = self.clock()
                    report.duration = time.monotonic() - started
                    return report
                later = self.clock()
                probe = self.store.probe(later, self.holder, later + self.offset)
            after = self.clock()
            held = self.held_elsewhere.retry_at(probe.window, claimed_at, report.claimed, after)
            report.next_wakeup = self._next_wakeup(probe, after, held)
        report.duration = time.monotonic() - started
        return report

    @property
    def stopping(self) -> float | None:
        """Set by the beat when told to stop mid-tick (``time.monotonic()``):
        publishing is bounded (see ``STOP_GRACE_SECONDS``)."""
        return self.sender.stopping

    @stopping.setter
    def stopping(self, since: float | None) -> None:
        self.sender.stopping = since

    def _set_offset(self, offset: timedelta) -> None:
        self.offset = offset
        for part in (self.sweeps, self.bookkeeper, self.writer, self.sender):
            part.offset = offset

    def _work(self, probe: Probe, now: datetime) -> bool:
        return (
            probe.unscheduled
            or probe.changed
            or self.refresher.baselining
            or probe.held_due
            or _due(probe.window, now)
            or _due(probe.retry_at, now)
            or (_due(probe.deadline, now) and self.sweeps.lost_sweep_due(now))
        )

    def _act(
        self, probe: Probe, now: datetime, report: TickReport, prepared: WrittenBatch | None = None
    ) -> None:
        # Lost runs first (a run declared lost no longer holds back its
        # routine's window), each an UPDATE outside the transaction below, so
        # that one locks routines before runs, like every other.
        if _due(probe.deadline, now):
            self.sweeps.sweep_lost(now, report)
        if probe.changed or self.refresher.baselining:
            self.refresher.refresh(now, now + self.offset, report)
        retries = []
        batch = prepared
        if batch is None or probe.unscheduled or _due(probe.retry_at, now):
            with self.store.transaction():
                if probe.unscheduled:
                    report.adopted = self._adopt(now)
                if _due(probe.retry_at, now):
                    retries = self.sweeps.retries_due(now, report)
                if batch is None:
                    batch = self._claim_and_write(now)
        report.add(batch.report)
        if batch.full:
            report.more_due = True
            if self.ahead is not None and self.stopping is None:
                excluding = batch.claimed_ids
                self.ahead.start(lambda: self._prepare(excluding))
        self.sweeps.send_retries(retries, now, report, self.ledger)
        self._publish(batch, now, report)
        if batch.claimed_ids:
            self._fit_claims_to_ttl(time.monotonic() - batch.started, len(batch.claimed_ids))

    def _publish(self, batch: WrittenBatch, now: datetime, report: TickReport) -> None:
        """Send a written batch, then write down what went out."""
        if batch.outgoing is not None:
            held = self.sender.send(batch.outgoing, batch.claimed_at, report)
            self.ledger.advanced(
                [
                    Advance(d.claimed.record.id, d.next_run_at)
                    for d in batch.outgoing.ready
                    if d.claimed.record.id in held
                ]
            )
        self.bookkeeper.record_published(now)

    def _claim_and_write(self, now: datetime, excluding: Sequence[int] = ()) -> WrittenBatch:
        """Claim due routines, decide them and write their rows, in the
        caller's transaction; what to publish once it commits."""
        report = TickReport()
        started = time.monotonic()
        limit = self.claim_limit
        claimed = self.store.routines.claim_due(
            now, self.holder, self.settings.lock_ttl, limit, now + self.offset, excluding
        )
        report.claimed = len(claimed)
        self.writer.lift_ended_suspensions(claimed, now)
        decisions = self._decide(claimed, now, report)
        outgoing = self.writer.write(decisions, now, report)
        ids = [record.id for record in claimed]
        return WrittenBatch(now, started, ids, outgoing, len(claimed) >= limit, report)

    def _prepare(self, excluding: Sequence[int]) -> WrittenBatch:
        """The burst's next batch, on the BatchPreparer's thread (its own connection and
        transaction), never one of ``excluding``: the batch being published."""
        now = self.clock()
        with self.store.session(), self.store.transaction():
            return self._claim_and_write(now, excluding)

    def wind_down(self) -> None:
        """Beat stopping, before its claims are released: publish the batch
        in preparation, as a tick told to stop does (within the same grace,
        the rest left ``pending`` for the next holder); then write down what
        this beat published and has not (see Bookkeeper)."""
        try:
            batch = self.ahead.take() if self.ahead is not None else None
            if batch is not None:
                report = TickReport()
                with self.store.session():
                    self._publish(batch, self.clock(), report)
                logger.info("stopping: sent %d run(s) of the batch written last", report.sent)
        except Exception:
            logger.warning("stopping: the batch written last was not all sent", exc_info=True)
        self.bookkeeper.write_down_before_stopping()

    def _fit_claims_to_ttl(self, took: float, claimed: int) -> None:
        """Claim no more routines than this beat carries out well within
        their claims: a tick that outlives them has its routines taken over
        mid-tick, and beats that keep doing so to each other thrash instead of
        sending. Halved after a slow tick, doubled back after fast ones."""
        budget = self.settings.lock_ttl * CLAIM_TRUSTED_SHARE
        limit = self.claim_limit
        if took > budget and claimed >= limit / 2:
            self.claim_limit = max(MIN_CLAIM_LIMIT, limit // 2)
        elif took < budget / 4 and claimed >= limit:
            self.claim_limit = min(self.settings.batch_size, limit * 2)
        if self.claim_limit != limit:
            logger.info(
                "a tick of %d routine(s) took %.2f s of %.0f s claims: claiming at most %d next",
                claimed,
                took,
                self.settings.lock_ttl,
                self.claim_limit,
            )

    def _next_wakeup(
        self, probe: Probe, now: datetime, held: datetime | None = None
    ) -> datetime | None:
        """The earliest of: a routine's window or claim expiry (``held``
        instead when the due windows were all held by other beats' open
        claims: see :mod:`celery_routines.tick.contention`), a retry's
        ``retry_at``, an open run's deadline (not before the lost sweep may
        run again, so an overdue run never makes the tick spin); now if
        routines still wait for adoption."""
        if probe.unscheduled:
            return now
        candidates = [held or probe.routine, probe.retry_at]
        if probe.deadline is not None:
            next_sweep = self.sweeps.next_lost_sweep()
            candidates.append(
                max(probe.deadline, next_sweep) if next_sweep is not None else probe.deadline
            )
        present = [instant for instant in candidates if instant is not None]
        return min(present) if present else None

    # -- adoption ------------------------------------------------------------

    def _adopt(self, now: datetime) -> int:
        """Give routines without a next window (new, changed, or inserted by
        plain SQL) their first one."""
        first_windows = []
        for record in self.store.routines.unscheduled(self.settings.batch_size):
            try:
                schedule = self._schedule(record)
                jitter = from_columns(record).jitter  # the send instants need a valid jitter
                # From the whole second, so interval windows (and their keys) do
                # not carry the adoption instant's microseconds forever. A
                # schedule with no window within its search bound is invalid
                # like a bad cron, not an error of the tick.
                first = first_window(schedule, now.replace(microsecond=0))
            except (ScheduleError, InvalidRoutine) as exc:
                self.writer.mark_invalid(record, exc, now, holder=None)
                continue
            first_windows.append(Advance(record.id, send_instant(first, record.name, jitter)))
            if is_never(first):
                logger.info(
                    "adopted %s: %s, which has no window left: done",
                    record.name,
                    schedule.describe(),
                )
            else:
                # In the routine's zone with its offset, as the "sent" lines
                # name windows (their idempotency keys).
                zone = load_zone(record.timezone or self.settings.timezone)
                logger.info(
                    "adopted %s: %s, first window %s",
                    record.name,
                    schedule.describe(),
                    first.astimezone(zone).isoformat(),
                )
        return self.store.routines.adopt(first_windows, now)

    # -- planning ------------------------------------------------------------

    def _schedule(self, record: RoutineRecord) -> Schedule:
        return schedule_of(record, record.timezone or self.settings.timezone)

    def _decide(
        self, claimed: list[RoutineRecord], now: datetime, report: TickReport
    ) -> list[Decision]:
        """Read what the claimed routines need, then decide each (pure)."""
        drafts: list[tuple[Claimed, FirePlan | None]] = []
        # A routine edited outside beat since its window was computed: the
        # stale window never fires (rescheduled from now instead).
        claimed = self.refresher.take_changed(claimed, now, now + self.offset, report)
        for record in claimed:
            try:
                schedule = self._schedule(record)
                # Every stored option must read, not only the schedule, before
                # the row counts as valid (again: else it flips each minute).
                routine = from_columns(record)
                item = Claimed(record, routine, schedule, record.timezone or self.settings.timezone)
                most = self.settings.catch_up_per_tick
                planned = (
                    decide.plan(item, now, most, self.answers)
                    if record.last_error is None
                    else None
                )
                drafts.append((item, planned))
            except (ScheduleError, InvalidRoutine) as exc:
                self.writer.mark_invalid(record, exc, now, holder=self.holder)
                report.invalid += 1
        usage = {
            item.record.id: self.store.spend.used_by_ceiling(
                item.record.id, item.routine.ceilings, now, item.timezone
            )
            for item, planned in drafts
            if planned is not None and decide.needs_usage(item, planned)
        }
        sending = [
            item.record.id for item, planned in drafts if planned is not None and planned.send
        ]
        open_runs = self.store.runs.open_runs(sending) if sending else {}
        decisions = []
        for item, planned in drafts:
            facts = Facts(usage.get(item.record.id), open_runs.get(item.record.id, ()), self.offset)
            try:
                decisions.append(
                    decide.decide(
                        item,
                        planned,
                        facts,
                        now,
                        run_timeout=self.settings.run_timeout,
                        start_timeout=self.settings.start_timeout,
                        answers=self.answers,
                    )
                )
            except ScheduleError as exc:
                self.writer.mark_invalid(item.record, exc, now, holder=self.holder)
                report.invalid += 1
        return self._take_over(decisions)

    def _take_over(self, decisions: list[Decision]) -> list[Decision]:
        """Only decisions that skip their due window cost a query (one, batched)."""
        wanted = {key: i for i, d in enumerate(decisions) if (key := decide.written_key(d))}
        if not wanted:
            return decisions
        for row in self.store.runs.find_windows(list(wanted)):
            index = wanted[(row.routine_id, row.idempotency_key, row.attempt)]
            decisions[index] = decide.take_over(decisions[index], row)
            logger.info(
                "%s was already written (%s) by a beat whose claim expired; not skipping it",
                row.idempotency_key,
                row.state,
            )
        return decisions


def _due(instant: datetime | None, now: datetime) -> bool:
    return instant is not None and instant <= now
