"""Recording a body's outcome: the success or the failure (with the retry
it calls for), written through a database outage or kept until it is back
(:mod:`celery_routines.worker.pending`), then the ceilings it may reach."""

from __future__ import annotations

import logging
import threading
from datetime import datetime

from celery import Celery
from sqlalchemy import Connection

from celery_routines.observe.final_failures import after_final_failure
from celery_routines.observe.notify import Notifies, notifier_for
from celery_routines.policy.runs import after_failure, policy_of
from celery_routines.policy.states import Reason, RunState
from celery_routines.store import Store
from celery_routines.worker import counting
from celery_routines.worker.ceiling import check_after_run
from celery_routines.worker.connection import run_statement
from celery_routines.worker.outage import Attempts, DatabaseUnreachable, log_failure
from celery_routines.worker.pending import (
    OutcomeSpool,
    PendingOutcome,
    PendingOutcomes,
    database_key,
)
from celery_routines.worker.stores import settings_for, store_for

logger = logging.getLogger("celery_routines.worker")


def record_failure(
    store: Store, run_id: str, error: str, now: datetime, *,
    lost: bool, notifier: Notifies | None = None, spend: dict[str, float] | None = None,
) -> None:  # fmt: skip
    """``running`` -> ``retrying`` (with ``retry_at``) or ``failed``/``lost``;
    a final one is notified and may pause the routine (pause_after_failures).
    ``spend``: the run's ledger (:func:`~celery_routines.worker.spend.end_run`)."""
    run = store.runs.get(run_id)
    if run is None:
        return
    routine = store.routines.by_id(run.routine_id)
    if routine is None:
        return
    decision = after_failure(
        run.attempt,
        policy_of(routine),
        now,
        final_state=RunState.LOST if lost else RunState.FAILED,
        reason=Reason.LOST if lost else None,
    )
    moved = store.runs.settle(
        run_id,
        from_states=(RunState.RUNNING,),
        state=decision.state,
        now=now,
        retry_at=decision.retry_at,
        reason=decision.reason,
        error=error,
        spend=spend,
    )
    if moved:
        logger.info(
            "run %s of %s (attempt %d) %s: %s; %s",
            run_id,
            routine.name,
            run.attempt,
            "lost its worker" if lost else "failed",
            error,
            decision.why,
        )
        if decision.retry_at is None:
            after_final_failure(
                store, routine_id=routine.id, routine=routine.name,
                pause_after=routine.pause_after_failures, run_id=run_id,
                window=run.scheduled_for, state=decision.state, error=error, now=now,
                notifier=notifier,
            )  # fmt: skip
    else:
        logger.warning(
            "outcome of run %s of %s arrived when it was already %s; left as it is",
            run_id,
            routine.name,
            run.state,
        )


def write_or_keep(app: Celery, outcome: PendingOutcome) -> None:
    """Write a body's outcome, riding out a short outage; kept for later
    (never dropped) when the database stays away longer."""
    try:
        store, settings = store_for(app), settings_for(app)
        write_outcome(app, store, outcome, patience=settings.database_patience)
    except DatabaseUnreachable:
        pending_for(app).keep(outcome)
    except Exception as error:
        log_failure(f"record the outcome of run {outcome.run_id}", error)


def write_outcome(app: Celery, store: Store, outcome: PendingOutcome, *, patience: float) -> None:
    """One outcome to the database (a success: one statement; a failure: the
    retry decision too), then the ceiling check it calls for."""
    if outcome.succeeded:

        def succeed(on: Connection | None, attempts: Attempts) -> bool:
            finished = store.outcomes.succeed(
                outcome.run_id, outcome.finished_at, spend=outcome.spend, on=on
            )
            if finished.done:
                return finished.check_ceiling
            if attempts.uncertain:
                run = store.runs.get(outcome.run_id)
                if run is not None and run.state == RunState.SUCCEEDED:
                    return True  # the cut try did land: check the ceiling as it would have
            logger.warning(
                "run %s succeeded after it was declared lost or replaced", outcome.run_id
            )
            return False

        check = run_statement(
            store, succeed, what=f"record the success of run {outcome.run_id}", patience=patience
        )
        if check:
            check_ceilings(app, outcome.run_id, outcome.finished_at)
        return

    def fail(on: Connection | None, attempts: Attempts) -> None:
        notifier = notifier_for(app, store.streaks.notify_url)
        record_failure(
            store, outcome.run_id, outcome.error or "unknown", outcome.finished_at,
            lost=outcome.lost, notifier=notifier, spend=outcome.spend,
        )  # fmt: skip

    run_statement(
        store, fail, what=f"record the failure of run {outcome.run_id}", patience=patience
    )
    check_ceilings(app, outcome.run_id, outcome.finished_at)


_pending: dict[str, PendingOutcomes] = {}
_pending_lock = threading.Lock()


def forget_pending() -> None:
    """In a freshly forked pool child: the parent's kept outcomes are the
    parent's to write (their writer thread did not survive the fork)."""
    with _pending_lock:
        _pending.clear()


def pending_for(app: Celery) -> PendingOutcomes:
    """This process's outcomes waiting for ``app``'s database."""
    settings = settings_for(app)
    with _pending_lock:
        pending = _pending.get(settings.database_url)
        if pending is None:

            def write(outcome: PendingOutcome) -> None:
                # One try each time round: the keeper's own loop waits.
                write_outcome(app, store_for(app), outcome, patience=0.001)

            pending = _pending[settings.database_url] = PendingOutcomes(
                database_key(settings.database_url), OutcomeSpool(settings.outcome_spool), write
            )
        return pending


def check_ceilings(app: Celery, run_id: str, now: datetime) -> None:
    """The ceilings a finished run may have reached (never raises)."""
    try:
        store = store_for(app)

        def suspended(routine: str, until: datetime, reason: str) -> None:
            counting.suspended(app, store, run_id, routine, until, reason)

        check_after_run(store, run_id, now, settings_for(app).timezone, suspended)
    except Exception as error:
        log_failure(f"check the ceilings after run {run_id}", error)
