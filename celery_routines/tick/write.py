"""The write and send half of a tick (:class:`~celery_routines.tick.engine.TickEngine`).

*write*: inside the tick's transaction, the decisions' run rows (after the
Redis gate), the suspensions, the deferrals of queued routines and the
replaced runs; *send*: after the commit, every written run in as few broker
round trips as the transport allows, a failed send recorded under the
routine's retry policy. A run goes out only after its row is committed: a
worker claims a run from its row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery_routines.clock import Clock
from celery_routines.config import Settings
from celery_routines.observe.events import Events
from celery_routines.policy.states import Reason, RunState
from celery_routines.sending.delivery import (
    begin_publish_runs,
    outgoing_run,
    record_send_failure,
)
from celery_routines.sending.gate import Gate
from celery_routines.sending.publish import Publisher, publishes_in_background
from celery_routines.sending.revoke import Revoker
from celery_routines.store import Advance, NewRun, Store
from celery_routines.tick.decide import Decision, Verdict
from celery_routines.tick.ledger import Unrecorded
from celery_routines.tick.marking import MarkingBehind
from celery_routines.tick.report import TickReport
from celery_routines.tick.skip_lines import log_overlap, skip_level, skip_line, skip_note

logger = logging.getLogger("celery_routines.beat")

# Messages go out on claims taken or renewed less than this share of
# routines_lock_ttl ago; older claims are renewed in the database first (the
# rest of the TTL is the margin for a chunk of messages and its bookkeeping).
CLAIM_TRUSTED_SHARE = 0.25
# Messages published between two looks at the claims (kombu's Redis batch).
PUBLISH_CHUNK = 500
# A beat told to stop mid-tick (SIGTERM) keeps publishing what it committed
# for at most this long; what is left stays pending for the next beat, which
# may take it at once (the stopping beat releases its claims).
STOP_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class InFlight:
    """A chunk of runs handed to the publisher, and the wait for its answer."""

    chunk: list[tuple[Decision, NewRun, str]]
    errors: Callable[[], list[str | None]]


@dataclass
class Outgoing:
    """What a tick wrote: the routines it moves on, the runs to send."""

    ready: list[Decision]
    sends: list[tuple[Decision, NewRun, str]] = field(default_factory=list)


class Writing:
    """What the engine provides to this half."""

    store: Store
    publisher: Publisher
    gate: Gate
    settings: Settings
    holder: str
    clock: Clock
    revoker: Revoker
    events: Events
    ledger: Unrecorded
    # PostgreSQL: a chunk is marked sent on another connection while the
    # next is published (see tick/marking.py); elsewhere None, marked here.
    marking: MarkingBehind | None
    # time.monotonic() when beat was told to stop (SIGTERM), else None.
    stopping: float | None
    # The database's clock minus the beat's, for claims and run deadlines.
    offset: timedelta

    def _renew_claims(self, ready: list[Decision], held: set[int], checked: datetime) -> set[int]:
        raise NotImplementedError

    def _mark_published(self) -> None:
        raise NotImplementedError

    def _write(
        self, decisions: list[Decision], now: datetime, report: TickReport
    ) -> Outgoing | None:
        """Carry the decisions out inside the transaction: the rows, the
        suspensions, the deferrals; what to send once it commits."""
        resumed = [d for d in decisions if d.verdict == Verdict.RESUMED]
        if resumed:
            advances = [Advance(d.claimed.record.id, d.next_run_at) for d in resumed]
            self.store.routines.advance(advances, self.holder, now)
            for d in resumed:
                logger.info("%s is valid again; resuming its schedule", d.claimed.routine.name)
        for d in decisions:
            self._suspend(d, now)
        queued = [d for d in decisions if d.verdict == Verdict.QUEUED]
        if queued:
            report.queued += len(queued)
            self.store.routines.defer(
                [d.claimed.record.id for d in queued],
                self.holder,
                queued[0].next_run_at + self.offset,  # a claim: on the database's clock
            )
        firing = [d for d in decisions if d.verdict == Verdict.FIRE]
        for d in (*queued, *firing):
            log_overlap(d)
        if not firing:
            return None
        deferred = self._apply_gate(firing)
        report.deferred = len(deferred)
        ready = [d for d in firing if d.claimed.record.id not in deferred]
        self._replace_open_runs(ready, now, report)

        new_runs = [run for d in ready for run in (*d.sends, *d.skips)]
        inserted = self.store.runs.insert_new(new_runs, now)
        takeovers = self._orphaned_pending(ready, inserted)

        outgoing = Outgoing(ready)
        for item in ready:
            name = item.claimed.routine.name
            for run in item.sends:
                run_id = run.id if run.id in inserted else takeovers.get(_window(run))
                if run_id is None:
                    report.conflicts += 1
                    logger.info(
                        "not sending %s: its run row already exists (another beat sent it)",
                        run.idempotency_key,
                    )
                    continue
                outgoing.sends.append((item, run, run_id))
            for run in item.skips:
                if run.id in inserted:
                    count = run.skipped_count or 1
                    report.skipped_windows += count
                    _count(report.skipped_by_reason, run.reason or RunState.SKIPPED, count)
                    self._skip_event(name, run)
                    line = skip_line(name, run, item.claimed.timezone, skip_note(item, run))
                    logger.log(skip_level(run), "%s", line)
        return outgoing

    def _send(self, outgoing: Outgoing, now: datetime, report: TickReport) -> set[int]:
        """Publish the written runs, after their rows are committed (a worker
        claims a run only from its row), in as few broker round trips as the
        transport allows; the ids of the routines whose claims held to the end.

        Messages go out in chunks, each under claims known to be live: a
        chunk that starts later than a quarter of ``routines_lock_ttl`` after
        the claims were taken or last renewed renews them first, so no other
        beat can take a routine over while its messages are going out.
        """
        try:
            held = self._publish_chunks(outgoing, now, report)
        except BaseException:
            if self.marking is not None:
                # The error in flight wins; a failed marking's batches stay in the ledger.
                with suppress(Exception):
                    self.marking.finish()
            raise
        if self.marking is not None:
            self.marking.finish()
        return held

    def _publish_chunks(self, outgoing: Outgoing, now: datetime, report: TickReport) -> set[int]:
        held = {d.claimed.record.id for d in outgoing.ready}
        confirmed = now
        trusted = timedelta(seconds=self.settings.lock_ttl * CLAIM_TRUSTED_SHARE)
        sending = [
            (item, run, run_id)
            for item, run, run_id in self._orphans_still_pending(outgoing.sends, report)
            if not self._too_late(item, run, run_id, report)
        ]
        # The chunk handed to the publisher and not yet answered: a publisher
        # in another process sends it while this one prepares the next. It is
        # taken out of ``in_flight`` before its answer is entered, so an error
        # while entering it never has that answer waited for twice.
        in_flight: InFlight | None = None
        in_background = publishes_in_background(self.publisher)
        try:
            for start in range(0, len(sending), PUBLISH_CHUNK):
                if self._out_of_grace():
                    last, in_flight = in_flight, None
                    self._answered(last, report)
                    return held - self._left_pending(sending[start:])
                if self.clock() >= confirmed + trusted:
                    confirmed = self.clock()
                    held = self._renew_claims(outgoing.ready, held, confirmed)
                chunk = [
                    send
                    for send in sending[start : start + PUBLISH_CHUNK]
                    if send[0].claimed.record.id in held
                ]
                messages = [
                    outgoing_run(item.claimed.routine, run, run_id) for item, run, run_id in chunk
                ]
                started = InFlight(chunk, begin_publish_runs(self.publisher, messages))
                if in_background:
                    previous, in_flight = in_flight, started
                    self._answered(previous, report, more=True)
                else:
                    self._answered(started, report, more=start + PUBLISH_CHUNK < len(sending))
            last, in_flight = in_flight, None
            self._answered(last, report)
        except BaseException:
            # What went out is entered in the ledger; the error in flight wins.
            with suppress(Exception):
                self._answered(in_flight, report)
            raise
        return held

    def _answered(self, in_flight: InFlight | None, report: TickReport, more: bool = False) -> None:
        """Wait for a chunk's answer and enter it; with ``more`` chunks after
        it, mark it sent now, while the claims still hold (a beat that takes
        a routine over later finds the row sent). The last chunk's are
        written with the advance, next."""
        if in_flight is None:
            return
        self._sent(in_flight.chunk, in_flight.errors(), report)
        if more:
            if self.marking is not None:
                self.marking.start()
            else:
                self._mark_published()

    def _out_of_grace(self) -> bool:
        return self.stopping is not None and time.monotonic() - self.stopping >= STOP_GRACE_SECONDS

    def _left_pending(self, unsent: list[tuple[Decision, NewRun, str]]) -> set[int]:
        """The routines of runs a stopping beat leaves unpublished: not moved
        on, so the beat that takes them over sends those same rows."""
        routines = {item.claimed.record.id for item, _, _ in unsent}
        logger.warning(
            "stopping: %d run(s) of %d routine(s) left pending after %.0f s of publishing; "
            "the next beat sends them",
            len(unsent),
            len(routines),
            STOP_GRACE_SECONDS,
        )
        return routines

    def _sent(
        self,
        chunk: list[tuple[Decision, NewRun, str]],
        errors: list[str | None],
        report: TickReport,
    ) -> None:
        """Enter what went out in the ledger; record what the broker refused."""
        published = [
            (run_id, item.claimed.routine.run_timeout)
            for (item, _, run_id), error in zip(chunk, errors, strict=True)
            if error is None
        ]
        self.ledger.published(
            [run_id for run_id, _ in published], self.clock(), [t for _, t in published]
        )
        for (item, run, run_id), error in zip(chunk, errors, strict=True):
            if error is None:
                report.sent += 1
            else:
                report.send_failures += 1
                record_send_failure(
                    self.store,
                    item.claimed.record,
                    run_id,
                    run.idempotency_key,
                    run.attempt,
                    error,
                    self.clock(),
                )

    def _suspend(self, decision: Decision, now: datetime) -> None:
        suspension = decision.suspension
        if suspension is None:
            return
        name = decision.claimed.routine.name
        if self.store.spend.suspend(
            decision.claimed.record.id, suspension.until, suspension.reason, now
        ):
            self.events.suspended(name, until=suspension.until, reason=suspension.reason)
            logger.warning(
                "suspended %s after sending %d of %d window(s): %s",
                name,
                len(decision.sends),
                decision.planned,
                suspension.reason,
            )

    def _replace_open_runs(self, ready: list[Decision], now: datetime, report: TickReport) -> None:
        """Close (``failed``, reason ``replaced``) and revoke with terminate the
        open runs a new window replaces; the row is closed first, so the killed
        run's late report changes nothing."""
        for d in ready:
            if not d.replace or not d.sends:
                continue
            by = d.sends[0].idempotency_key
            replaced = self.store.runs.mark_replaced(list(d.replace), by, now)
            if replaced:
                report.replaced += len(replaced)
                self.revoker.revoke(replaced)
                logger.warning(
                    "replaced run(s) %s of %s: revoked (terminate) for the new window %s",
                    ", ".join(replaced),
                    d.claimed.routine.name,
                    by,
                )

    def _apply_gate(self, firing: list[Decision]) -> set[int]:
        """Routine ids to leave due this tick: the gate holds one of their
        windows and no run row exists yet, so a beat that set the key may have
        died before writing; the claim and the key expire together."""
        runs = [run for d in firing for run in d.sends]
        answers = self.gate.acquire([f"{run.idempotency_key}#{run.attempt}" for run in runs])
        refused = [run for run, ok in zip(runs, answers, strict=True) if not ok]
        if not refused:
            return set()
        stored = {_window(r) for r in self.store.runs.find_windows([_window(r) for r in refused])}
        deferred = {run.routine_id for run in refused if _window(run) not in stored}
        for routine_id in deferred:
            logger.info(
                "routine id %s left due: the gate holds its window but no run row exists yet",
                routine_id,
            )
        return deferred

    def _orphaned_pending(
        self, ready: list[Decision], inserted: set[str]
    ) -> dict[tuple[int, str, int], str]:
        """Rows left ``pending`` by a beat that died between writing and
        sending, or that was still writing when its claims expired and this
        beat took them over (see ``TickEngine._renew_claims``).

        We hold the routine's claim now, so the writer's claim expired (or the
        writer is this beat, and it did not publish the row: what it published
        is marked sent before any of its ticks reads again, see ``ledger``).
        Sending an orphan again is safe because the worker claims a run once.
        """
        conflicted = [_window(run) for d in ready for run in d.sends if run.id not in inserted]
        if not conflicted:
            return {}
        return {
            (row.routine_id, row.idempotency_key, row.attempt): row.id
            for row in self.store.runs.find_windows(conflicted)
            if row.state == RunState.PENDING
        }

    def _orphans_still_pending(
        self, sends: list[tuple[Decision, NewRun, str]], report: TickReport
    ) -> list[tuple[Decision, NewRun, str]]:
        """Look again, just before publishing, at the rows taken over from
        another beat: if that beat was only slow, not gone, it may have
        published and marked them sent since this tick read them."""
        orphans = [run_id for _, run, run_id in sends if run_id != run.id]
        if not orphans:
            return sends
        pending = self.store.runs.still_pending(orphans)
        kept = []
        for send in sends:
            _, run, run_id = send
            if run_id != run.id and run_id not in pending:
                report.conflicts += 1
                logger.info(
                    "not sending %s: the beat that wrote it sent it meanwhile", run.idempotency_key
                )
                continue
            kept.append(send)
        return kept

    def _too_late(self, item: Decision, run: NewRun, run_id: str, report: TickReport) -> bool:
        """``max_lateness`` judged now, at the moment of sending, not when the
        row was read: a long drain behind a backlog cannot send a stale window."""
        limit = item.claimed.routine.max_lateness
        if limit is None:
            return False
        # From the send instant: a jittered window is due `offset` after it.
        lateness = (self.clock() - item.claimed.send_at(run.scheduled_for)).total_seconds()
        if lateness <= limit or not self.store.runs.skip_late(run_id, self.clock()):
            return False
        report.skipped_windows += 1
        _count(report.skipped_by_reason, Reason.LATE, 1)
        self.events.skipped(
            item.claimed.routine.name,
            reason=Reason.LATE,
            count=1,
            first=run.scheduled_for,
            last=run.scheduled_for,
            run_id=run_id,
        )
        logger.warning(
            "skipped %s: late (%.1f s late at send time, max_lateness is %s s)",
            run.idempotency_key,
            lateness,
            limit,
        )
        return True

    def _skip_event(self, routine: str, run: NewRun) -> None:
        assert run.skipped_first is not None and run.skipped_last is not None
        self.events.skipped(
            routine,
            reason=run.reason or "",
            count=run.skipped_count or 1,
            first=run.skipped_first,
            last=run.skipped_last,
            run_id=run.id,
        )


def _count(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n


def _window(run: NewRun) -> tuple[int, str, int]:
    return (run.routine_id, run.idempotency_key, run.attempt)
