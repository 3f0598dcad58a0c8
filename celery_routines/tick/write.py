"""The write half of a tick: inside the tick's transaction, the decisions'
run rows (after the Redis gate), the suspensions, the deferrals of queued
routines and the replaced runs; what to send once it commits
(:class:`~celery_routines.tick.send.WindowSender` sends it). A run goes out
only after its row is committed: a worker claims a run from its row.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from celery_routines.errors import InvalidRoutine
from celery_routines.observe.events import Events
from celery_routines.policy.decide import Decision, Verdict
from celery_routines.policy.states import RunState
from celery_routines.sending.gate import Gate
from celery_routines.sending.revoke import Revoker
from celery_routines.store import Advance, NewRun, RoutineRecord, RunRecord, Store
from celery_routines.tick.report import TickReport
from celery_routines.tick.send import Outgoing
from celery_routines.tick.skip_lines import log_overlap, skip_level, skip_line, skip_note

logger = logging.getLogger("celery_routines.beat")

# A routine whose schedule cannot be computed is looked at again this often.
INVALID_RETRY = timedelta(minutes=1)


class RunWriter:
    """Writes a tick's decisions, in the tick's transaction."""

    def __init__(
        self, store: Store, gate: Gate, holder: str, revoker: Revoker, events: Events
    ) -> None:
        self.store = store
        self.gate = gate
        self.holder = holder
        self.revoker = revoker
        self.events = events
        # The database's clock minus the beat's, for claims (set each tick).
        self.offset = timedelta(0)

    def lift_ended_suspensions(self, claimed: list[RoutineRecord], now: datetime) -> None:
        """Claimed routines whose ceiling period turned are suspended no more."""
        ended = [
            r.id for r in claimed if r.suspended_until is not None and r.suspended_until <= now
        ]
        for routine_id in self.store.spend.lift_expired(ended, now):
            name = next(r.name for r in claimed if r.id == routine_id)
            logger.info("resumed %s: its ceiling period turned", name)

    def mark_invalid(
        self, record: RoutineRecord, exc: Exception, now: datetime, holder: str | None
    ) -> None:
        """A routine whose stored definition does not read: its error stored
        (beat looks again after ``INVALID_RETRY``) and sent as an event."""
        message = str(exc) if isinstance(exc, InvalidRoutine) else f"routine {record.name!r}: {exc}"
        if record.last_error and record.cron is None and record.interval_seconds is None:
            # A beat_schedule entry stored with its own error: it says more than "no schedule".
            message = record.last_error
        retry_at = now + INVALID_RETRY
        logger.error("%s; marked invalid, looking again at %s", message, retry_at.isoformat())
        self.store.routines.mark_invalid(record.id, message, retry_at, holder, now)
        self.events.invalid(record.name, error=message, before=record.last_error)

    def write(
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
                    report.skipped(run.reason or RunState.SKIPPED, run.skipped_count or 1)
                    self._skip_event(name, run)
                    line = skip_line(name, run, item.claimed.timezone, skip_note(item, run))
                    logger.log(skip_level(run), "%s", line)
        return outgoing

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


def _window(run: NewRun | RunRecord) -> tuple[int, str, int]:
    return (run.routine_id, run.idempotency_key, run.attempt)
