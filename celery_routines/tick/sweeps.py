"""The two run sweeps of a beat tick: lost runs and due retries.

Both are range scans of a partial index (``ix_routine_runs_deadline``,
``ix_routine_runs_retry_due``) limited to the batch size, so their cost grows
with what is overdue, not with the history kept. Decisions are pure and
come from :mod:`celery_routines.policy.runs` (a lost run's retry) and
:mod:`celery_routines.policy.retries` (a due retry); this module reads what
they need and carries them out. The store's conditional UPDATEs make each
transition happen once however many beats sweep at the same time.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from celery_routines.clock import Clock, utc_now
from celery_routines.config import Settings
from celery_routines.observe.events import Events, NoEvents
from celery_routines.observe.final_failures import after_final_failure
from celery_routines.policy.retries import (
    RetryDecision,
    RetryVerdict,
    decide_retry,
    exclusive,
)
from celery_routines.policy.routine import Routine
from celery_routines.policy.runs import after_failure, policy_of
from celery_routines.policy.states import OPEN_STATES, Reason, RunState, no_retry
from celery_routines.sending.publish import Publisher
from celery_routines.sending.sender import Outbound, Sender, outgoing_run
from celery_routines.store import NewRun, Store
from celery_routines.store.records import DueRetry
from celery_routines.tick.ledger import PublishLedger
from celery_routines.tick.skip_lines import late_skipped

if TYPE_CHECKING:
    from celery_routines.tick.report import TickReport

logger = logging.getLogger("celery_routines.beat")

# The lost sweep runs at most this often (by the injected clock; a clock that
# steps backwards sweeps at once rather than waiting for the old instant).
LOST_SWEEP_EVERY = timedelta(seconds=5)


class Sweeps:
    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        settings: Settings,
        events: Events | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.events: Events = events or NoEvents()
        self.store = store
        self.publisher = publisher
        self.settings = settings
        # When retries went out (and a refused one failed): the tick's clock.
        self.clock = clock
        self._last_lost_sweep: datetime | None = None
        # The database's clock minus the beat's (set by the engine each tick):
        # run deadlines are written and compared on the database's clock.
        self.offset = timedelta(0)

    # -- lost runs -------------------------------------------------------------

    def next_lost_sweep(self) -> datetime | None:
        if self._last_lost_sweep is None:
            return None
        return self._last_lost_sweep + LOST_SWEEP_EVERY

    def lost_sweep_due(self, now: datetime) -> bool:
        last = self._last_lost_sweep
        return last is None or not (last <= now < last + LOST_SWEEP_EVERY)

    def sweep_lost(self, now: datetime, report: TickReport) -> None:
        """Open runs past their deadline become ``lost``, visibly, and are
        retried under the routine's policy (``retrying`` with reason lost)."""
        if not self.lost_sweep_due(now):
            return
        self._last_lost_sweep = now
        overdue = self.store.runs.overdue(now + self.offset, self.settings.batch_size)
        if len(overdue) >= self.settings.batch_size:
            report.more_due = True
        for run in overdue:
            routine = self.store.routines.by_id(run.routine_id)
            if routine is None:
                continue
            decision = after_failure(
                run.attempt, policy_of(routine), now, final_state=RunState.LOST, reason=Reason.LOST
            )
            error = (
                f"no outcome by {run.deadline_at:%Y-%m-%d %H:%M:%S} UTC while {run.state}"
                + (f" on {run.worker}" if run.worker else "")
                + "; the worker was probably lost"
            )
            if run.state == RunState.PENDING:
                error = "never sent: the beat that wrote it stopped before sending it"
            elif run.state == RunState.SENT:
                error = (
                    f"not started by {run.deadline_at:%Y-%m-%d %H:%M:%S} UTC: no worker claimed "
                    "it within routines_start_timeout (its message lost, or waiting in a long "
                    "queue; a late message still runs it while its retry has not gone out)"
                )
            moved = self.store.runs.settle(
                run.id,
                from_states=OPEN_STATES,
                overdue_at=now + self.offset,
                state=decision.state,
                now=now,
                retry_at=decision.retry_at,
                reason=decision.reason,
                error=error,
            )
            if moved:
                report.lost += 1
                self.events.lost(routine.name, run_id=run.id, idempotency_key=run.idempotency_key)
                logger.warning(
                    "run %s of %s (attempt %d) declared lost: %s; %s",
                    run.id,
                    routine.name,
                    run.attempt,
                    error,
                    decision.why,
                )
                if decision.retry_at is None:
                    after_final_failure(
                        self.store, routine_id=routine.id, routine=routine.name,
                        pause_after=routine.pause_after_failures, run_id=run.id,
                        window=run.scheduled_for, state=decision.state, error=error, now=now,
                        notifier=self.events.notifier,
                    )  # fmt: skip

    # -- retries ---------------------------------------------------------------

    def retries_due(self, now: datetime, report: TickReport) -> list[DueRetry]:
        """The ``retrying`` runs whose ``retry_at`` has come (read inside the
        tick's first transaction; sent by :meth:`send_retries` after it)."""
        due = self.store.retries.retries_due(now, self.settings.batch_size)
        if len(due) >= self.settings.batch_size:
            report.more_due = True
        return due

    def send_retries(
        self, due: list[DueRetry], now: datetime, report: TickReport, ledger: PublishLedger
    ) -> None:
        """Send attempt N+1 of each due retry as :func:`decide_retry` says;
        each is taken by one beat only, and the taken ones go out together,
        batched like a tick's windows. What went out is entered in
        ``ledger``; the tick marks it sent."""
        taken: list[tuple[DueRetry, Routine, NewRun]] = []
        holding = self._runs_holding_retries(due, now)
        for item in due:
            run = item.run
            decision = self._decide_retry(item, holding.get(run.routine_id, ()), now)
            self._suspend_for_retry(item, decision, now)
            if decision.verdict == RetryVerdict.WAIT:
                self._wait(item, decision)
            elif decision.verdict == RetryVerdict.DROP:
                self._drop(item, decision, report)
            elif decision.verdict == RetryVerdict.SKIP_LATE:
                self._skip_late(item, decision, now, report)
            elif decision.next_run is not None and decision.routine is not None:
                next_run = decision.next_run
                if not self.store.retries.take_retry(run.id, decision.settled, next_run, now):
                    report.conflicts += 1
                    logger.info(
                        "retry of %s attempt %d taken by another beat",
                        run.idempotency_key,
                        next_run.attempt,
                    )
                    continue
                taken.append((item, decision.routine, next_run))
                # The attempt now open holds the routine's later retries back.
                holding.setdefault(run.routine_id, []).append(next_run.idempotency_key)
        if not taken:
            return
        outbound = [
            Outbound(outgoing_run(model, next_run), item.routine) for item, model, next_run in taken
        ]
        done = Sender(self.store, self.publisher, self.clock).send(outbound, ledger)
        report.retries_sent += done.sent
        report.send_failures += done.failed

    def _decide_retry(
        self, item: DueRetry, open_keys: Sequence[str], now: datetime
    ) -> RetryDecision:
        """The pure decision, with the ceiling usage read when it asks for it."""
        run, routine = item.run, item.routine
        decide = functools.partial(
            decide_retry,
            run,
            routine,
            open_keys,
            now,
            offset=self.offset,
            run_timeout=self.settings.run_timeout,
            start_timeout=self.settings.start_timeout,
            timezone=self.settings.timezone,
        )
        decision = decide()
        if decision.verdict == RetryVerdict.READ_USAGE:
            zone = routine.timezone or self.settings.timezone
            used = self.store.spend.used_by_ceiling(routine.id, decision.ceilings, now, zone)
            decision = decide(used=used)
        return decision

    def _suspend_for_retry(self, item: DueRetry, decision: RetryDecision, now: datetime) -> None:
        suspension, routine = decision.suspension, item.routine
        if suspension is not None and self.store.spend.suspend(
            routine.id, suspension.until, suspension.reason, now
        ):
            logger.warning("suspended %s: %s", routine.name, suspension.reason)

    def _wait(self, item: DueRetry, decision: RetryDecision) -> None:
        run, retry_at = item.run, decision.retry_at
        if retry_at is not None and self.store.retries.postpone_retry(run.id, retry_at):
            logger.info(
                "retry of %s attempt %d waits: overlap=%s and %s is open",
                run.idempotency_key,
                run.attempt,
                item.routine.overlap,
                decision.holding,
            )

    def _drop(self, item: DueRetry, decision: RetryDecision, report: TickReport) -> None:
        run, reason = item.run, decision.reason or no_retry("invalid")
        if not self.store.retries.cancel_retry(run.id, decision.settled, reason):
            return
        report.retries_cancelled += 1
        if decision.holding is not None:
            logger.warning(
                "retry of %s attempt %d dropped: overlap=replace and %s is open",
                run.idempotency_key,
                run.attempt,
                decision.holding,
            )
        else:
            logger.warning(
                "retry of %s attempt %d dropped: routine %s is %s",
                run.idempotency_key,
                run.attempt,
                item.routine.name,
                decision.why,
            )

    def _skip_late(
        self, item: DueRetry, decision: RetryDecision, now: datetime, report: TickReport
    ) -> None:
        """The next attempt as a ``skipped`` row, reason ``late``, like a
        first attempt past ``max_lateness``; the failed attempt settles."""
        run, routine, skipped = item.run, item.routine, decision.next_run
        assert skipped is not None  # a SKIP_LATE decision carries its row
        if not self.store.retries.take_retry(run.id, decision.settled, skipped, now):
            report.conflicts += 1
            return
        late_skipped(report, self.events, routine.name, run.scheduled_for, skipped.id)
        logger.warning(
            "retry of %s (attempt %d) skipped: late, past max_lateness %ss of its window",
            run.idempotency_key,
            run.attempt + 1,
            f"{routine.max_lateness:g}",
        )

    def _runs_holding_retries(self, due: list[DueRetry], now: datetime) -> dict[int, list[str]]:
        """The window keys of the open runs of the routines whose overlap
        policy holds a retry back (skip, queue, replace), by routine id:
        their ``pending`` rows too, the windows this tick is about to send."""
        ids = sorted({item.run.routine_id for item in due if exclusive(item.routine.overlap)})
        if not ids:
            return {}
        deadline = now + self.offset
        return {
            routine_id: [
                run.idempotency_key
                for run in runs
                if run.deadline_at is None or run.deadline_at > deadline
            ]
            for routine_id, runs in self.store.runs.open_runs(ids).items()
        }
