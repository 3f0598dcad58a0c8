"""What a tick does with one due retry: a pure decision.

A ``retrying`` attempt whose ``retry_at`` has come goes out as attempt N+1
unless something stops it, looked at in this order:

1. the overlap policy: with another run of the routine open, under ``skip``
   and ``queue`` the retry waits for it (it is the same window's next attempt,
   not a new window to drop); under ``replace`` the newer run has replaced its
   window, so the retry is dropped;
2. the routine's state (retired, disabled, paused, suspended) drops it;
3. a stored definition that no longer reads drops it;
4. the before-send ceiling check drops it (and may suspend the routine);
5. past ``max_lateness`` of its window, the next attempt is written as a
   ``skipped`` row, reason ``late``, like a first attempt would be;
6. else the next attempt is sent, with its lost deadline.

Dropped means dropped, not postponed: resuming the routine later must not
replay a backlog of retries in a burst. The caller reads (the due retries,
the routine's open runs, the ceiling usage when asked for) and carries the
answer out (:mod:`celery_routines.tick.sweeps`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

from celery_routines.errors import InvalidRoutine
from celery_routines.policy.ceilings import Ceiling, Suspension, decide_before_send
from celery_routines.policy.claimed import IdFactory, RunWindowLike, random_id
from celery_routines.policy.routine import Routine
from celery_routines.policy.routine_rows import from_columns
from celery_routines.policy.runs import (
    QUEUE_RECHECK,
    NewRun,
    RetryColumnsLike,
    blocked_reason,
    lost_deadline,
    policy_of,
    settled_state,
    unstarted_timeout,
)
from celery_routines.policy.states import Overlap, Reason, RunState, no_retry

# Overlap policies under which a retry never runs beside another run of its routine.
EXCLUSIVE_RETRIES = (Overlap.SKIP, Overlap.QUEUE, Overlap.REPLACE)


class RetryingRunLike(RunWindowLike, Protocol):
    """The ``retrying`` attempt as deciding reads it: its window, id and reason."""

    @property
    def id(self) -> str: ...
    @property
    def reason(self) -> str | None: ...


class RetryingRoutineLike(RetryColumnsLike, Protocol):
    """The stored row of a retrying run's routine (the store's ``RoutineRecord``):
    its retry columns, overlap policy and zone, and every definition column
    :func:`~celery_routines.policy.routine_rows.from_columns` reads."""

    @property
    def overlap(self) -> str: ...
    @property
    def timezone(self) -> str | None: ...


class RetryVerdict(StrEnum):
    SEND = "send"
    """Attempt N+1 (``next_run``) goes out; the failed attempt settles."""
    SKIP_LATE = "skip_late"
    """Attempt N+1 is written ``skipped`` (``next_run``), reason ``late``."""
    DROP = "drop"
    """No further attempt: the failed one settles with ``reason``."""
    WAIT = "wait"
    """Another run of the routine is open: looked at again at ``retry_at``."""
    READ_USAGE = "read_usage"
    """Ask again with the usage of ``ceilings`` (``used``)."""


@dataclass(frozen=True)
class RetryDecision:
    verdict: RetryVerdict
    settled: str
    """The failed attempt's final state (``failed``, or ``lost``)."""
    next_run: NewRun | None = None
    reason: str | None = None
    """For ``DROP``: the settled attempt's reason (``no_retry:<why>``)."""
    why: str | None = None
    """For ``DROP``: what stopped it, for the log line (``paused``, ...)."""
    holding: str | None = None
    """For ``WAIT`` and a ``replace`` drop: the open run's window key."""
    retry_at: datetime | None = None
    """For ``WAIT``: when to look again."""
    suspension: Suspension | None = None
    """Set when the ceiling check suspends the routine (with any verdict)."""
    ceilings: tuple[Ceiling, ...] = ()
    """For ``READ_USAGE``: the ceilings whose usage to read."""
    routine: Routine | None = None
    """The routine's definition, when it reads (the message is built from it)."""


def exclusive(overlap: str) -> bool:
    """Whether the overlap policy holds a retry back while another run is open."""
    return overlap in EXCLUSIVE_RETRIES


def decide_retry(
    run: RetryingRunLike,
    routine: RetryingRoutineLike,
    open_keys: Sequence[str],
    now: datetime,
    *,
    offset: timedelta,
    run_timeout: float,
    timezone: str,
    start_timeout: float | None = None,
    used: Mapping[str, float] | None = None,
    new_id: IdFactory = random_id,
) -> RetryDecision:
    """What to do with the due retry ``run`` of ``routine`` (its stored row:
    a ``RoutineRecord`` or any object with the columns as attributes).

    ``open_keys``: the window keys of the routine's open runs (read for an
    exclusive overlap policy only); ``offset``: the database's clock minus
    ``now``'s, which run deadlines are written on; ``run_timeout`` and
    ``timezone``: the configured defaults; ``used``: the ceiling usage, once
    a ``READ_USAGE`` answer asked for it.
    """
    settled = settled_state(run.reason)
    others = [key for key in open_keys if key != run.idempotency_key]
    if others and exclusive(routine.overlap):
        if routine.overlap == Overlap.REPLACE:
            why = Reason.REPLACED.value
            return RetryDecision(
                RetryVerdict.DROP, settled, reason=no_retry(why), why=why, holding=others[0]
            )
        return RetryDecision(
            RetryVerdict.WAIT, settled, holding=others[0], retry_at=now + QUEUE_RECHECK
        )
    blocked = blocked_reason(policy_of(routine), now)
    if blocked is not None:
        return _drop(settled, blocked)
    try:
        model = from_columns(routine)
    except InvalidRoutine as exc:
        return _drop(settled, f"invalid ({exc.problem})")
    suspension = None
    if model.ceilings:
        if used is None:
            return RetryDecision(RetryVerdict.READ_USAGE, settled, ceilings=model.ceilings)
        zone = routine.timezone or timezone
        budget = decide_before_send(model.ceilings, used, now, zone, wanted=1)
        suspension = budget.suspension
        if not budget.send:
            return _drop(settled, "over its ceiling", suspension)
    attempt = run.attempt + 1
    if late_retry(model.max_lateness, run.scheduled_for, now):
        skipped = NewRun(
            id=new_id(),
            routine_id=run.routine_id,
            idempotency_key=run.idempotency_key,
            attempt=attempt,
            scheduled_for=run.scheduled_for,
            state=RunState.SKIPPED,
            reason=Reason.LATE,
            skipped_count=1,
            skipped_first=run.scheduled_for,
            skipped_last=run.scheduled_for,
        )
        return RetryDecision(
            RetryVerdict.SKIP_LATE, settled, skipped, suspension=suspension, routine=model
        )
    next_run = NewRun(
        id=new_id(),
        routine_id=run.routine_id,
        idempotency_key=run.idempotency_key,
        attempt=attempt,
        scheduled_for=run.scheduled_for,
        deadline_at=lost_deadline(
            now + offset, unstarted_timeout(model.run_timeout or run_timeout, start_timeout)
        ),
    )
    return RetryDecision(RetryVerdict.SEND, settled, next_run, suspension=suspension, routine=model)


def late_retry(max_lateness: float | None, window: datetime, now: datetime) -> bool:
    """A retry going out now would be later than the window's lateness limit."""
    return max_lateness is not None and now - window > timedelta(seconds=max_lateness)


def _drop(settled: str, why: str, suspension: Suspension | None = None) -> RetryDecision:
    return RetryDecision(
        RetryVerdict.DROP, settled, reason=no_retry(why), why=why, suspension=suspension
    )
