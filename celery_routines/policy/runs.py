"""The run lifecycle's decisions, as pure functions.

No I/O and no clock: the worker and the beat tick read the time once, look up
the rows, and pass both in; the store and the engine carry the answer out.

The states of a run and what moves it (see the README for the table)::

    pending  --beat sends-->            sent
    pending  --send fails-->            retrying | failed
    sent     --worker claims-->         running
    running  --body returns-->          succeeded
    running  --body raises-->           retrying | failed
    sent, running --deadline passes-->  retrying | lost      (beat's lost sweep)
    running  --pool child dies-->       retrying | lost      (WorkerLostError)
    running  --Celery self.retry()-->   sent                 (same run, redelivered)
    sent, running --overlap=replace-->  failed (reason replaced)
    retrying --retry_at passes-->       failed | lost        (attempt N+1 written and sent)
    retrying --routine paused-->        failed | lost        (reason no_retry:paused)
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from celery_routines.policy.states import Overlap, Reason, RunState, no_retry

# A task with its own hard time limit is declared lost this long after the
# limit: the worker kills the task at the limit and reports it in seconds, so
# a run still open well after that has lost its worker.
TIME_LIMIT_MARGIN = 60.0

# How soon beat looks again at a routine held back by ``overlap="queue"``.
# Short, so the window goes out soon after the open run ends; not zero, so a
# queued routine never makes the tick spin.
QUEUE_RECHECK = timedelta(seconds=1)


@dataclass(frozen=True)
class RetryPolicy:
    """What the routine row says about retrying, at the moment of deciding."""

    max_retries: int
    retry_base_seconds: float
    enabled: bool = True
    paused: bool = False
    suspended_until: datetime | None = None
    # No longer declared in code by its owner: it fires nothing, retries included.
    retired: bool = False


class RetryColumnsLike(Protocol):
    """The columns of a stored routine row that say how it retries (the
    store's ``RoutineRecord``)."""

    @property
    def max_retries(self) -> int: ...
    @property
    def retry_base_seconds(self) -> float: ...
    @property
    def enabled(self) -> bool: ...
    @property
    def paused(self) -> bool: ...
    @property
    def suspended_until(self) -> datetime | None: ...


def policy_of(routine: RetryColumnsLike) -> RetryPolicy:
    """The retry policy carried by a stored routine row (a ``RoutineRecord``)."""
    return RetryPolicy(
        max_retries=routine.max_retries,
        retry_base_seconds=routine.retry_base_seconds,
        enabled=routine.enabled,
        paused=routine.paused,
        suspended_until=routine.suspended_until,
        retired=getattr(routine, "retired_at", None) is not None,
    )


@dataclass(frozen=True)
class AfterFailure:
    """What becomes of a failed or lost attempt."""

    state: str
    """``retrying``, or the final state (``failed``/``lost``) when no retry."""
    retry_at: datetime | None
    reason: str | None
    why: str
    """For the log line: why a retry was or was not scheduled."""


def retry_delay(attempt: int, base_seconds: float) -> timedelta:
    """The wait after failed attempt ``attempt`` (1-based): base * 2**(attempt-1)."""
    return timedelta(seconds=base_seconds * 2 ** (attempt - 1))


def blocked_reason(policy: RetryPolicy, now: datetime) -> str | None:
    """Why the routine may not retry right now (paused, suspended, disabled)."""
    if policy.retired:
        return "retired"
    if not policy.enabled:
        return "disabled"
    if policy.paused:
        return "paused"
    if policy.suspended_until is not None and policy.suspended_until > now:
        return "suspended"
    return None


def after_failure(
    attempt: int,
    policy: RetryPolicy,
    finished_at: datetime,
    *,
    final_state: str = RunState.FAILED,
    reason: str | None = None,
) -> AfterFailure:
    """Decide whether failed (or lost) attempt ``attempt`` is retried, and when.

    Attempt N is retried while N <= max_retries, so max_retries=4 means five
    attempts in all. A paused, suspended or disabled routine schedules none:
    the attempt takes its final state with the reason ``no_retry:<why>``.
    """
    blocked = blocked_reason(policy, finished_at)
    if blocked is not None:
        return AfterFailure(
            final_state, None, no_retry(blocked), f"not retried: the routine is {blocked}"
        )
    if attempt > policy.max_retries:
        return AfterFailure(
            final_state,
            None,
            reason,
            f"not retried: attempt {attempt} was the last (max_retries={policy.max_retries})",
        )
    retry_at = finished_at + retry_delay(attempt, policy.retry_base_seconds)
    return AfterFailure(
        RunState.RETRYING,
        retry_at,
        reason,
        f"attempt {attempt + 1} of {policy.max_retries + 1} at {retry_at.isoformat()}",
    )


def settled_state(reason: str | None) -> str:
    """The final state of a ``retrying`` attempt once its retry is sent (or
    cancelled): ``lost`` if it never reported back, else ``failed``."""
    return RunState.LOST if reason == Reason.LOST else RunState.FAILED


def lost_deadline(
    started_at: datetime, run_timeout: float, time_limit: float | None = None
) -> datetime:
    """When an open run that has not reported back is declared lost.

    ``routines_run_timeout`` after it was sent or started, or, for a task
    with its own hard time limit, that limit plus a margin. While the body
    runs, its worker's heartbeats push the deadline on (never back).
    """
    return started_at + timedelta(seconds=lost_after(run_timeout, time_limit))


def unstarted_timeout(run_timeout: float, start_timeout: float | None) -> float:
    """Seconds a sent run may wait for a worker's claim before it is
    declared lost: ``routines_start_timeout``, or the run timeout if that is
    shorter (None: the run timeout). A message lost by a broker restart thus
    holds its routine behind ``overlap="skip"`` this long, not an hour; the
    claim then gives the run its run timeout from its start."""
    if start_timeout is None:
        return run_timeout
    return min(run_timeout, start_timeout)


def celery_retry_wait(when: object, now: datetime) -> timedelta:
    """How long until the redelivery of Celery's own ``self.retry()``: its
    ``when`` (seconds or an aware instant; anything else: at once)."""
    if isinstance(when, int | float):
        return timedelta(seconds=max(0.0, float(when)))
    if isinstance(when, datetime) and when.tzinfo is not None:
        return max(timedelta(0), when - now)
    return timedelta(0)


def lost_after(run_timeout: float, time_limit: float | None = None) -> float:
    """Seconds from a run's start to its :func:`lost_deadline`: a database
    adds them to its own clock in the statement that claims the run."""
    if time_limit is not None and time_limit > 0:
        return time_limit + TIME_LIMIT_MARGIN
    return run_timeout


def overlap_action(policy: Overlap, open_runs: int) -> str:
    """What a due window does when the routine may still be running.

    ``send`` (nothing open, or ``overlap``), ``skip``, ``queue`` or ``replace``.
    """
    if open_runs == 0 or policy == Overlap.OVERLAP:
        return "send"
    return policy.value


@dataclass(frozen=True)
class NewRun:
    """A run row to write before its message is sent (decided here, written by
    the store)."""

    id: str
    routine_id: int
    idempotency_key: str
    attempt: int
    scheduled_for: datetime
    state: str = RunState.PENDING
    reason: str | None = None
    skipped_count: int | None = None
    skipped_first: datetime | None = None
    skipped_last: datetime | None = None
    # Open rows get one so a beat that dies between writing and sending
    # leaves a run the lost sweep finds.
    deadline_at: datetime | None = None


class OpenRunLike(Protocol):
    """What :func:`in_progress` reads of an open run row."""

    @property
    def state(self) -> str: ...
    @property
    def idempotency_key(self) -> str: ...
    @property
    def deadline_at(self) -> datetime | None: ...


R = TypeVar("R", bound=OpenRunLike)


def in_progress(runs: Sequence[R], planned: Set[str], now: datetime) -> list[R]:
    """The open runs that hold a routine back.

    A pending row is ours or an orphan being re-sent, not a run in progress; a
    run past its deadline is lost, whether or not the sweep has said so yet; a
    run of a window planned again is that window's own row (a conflict the
    unique key settles), not an overlap.
    """
    return [
        run
        for run in runs
        if run.state != RunState.PENDING
        and run.idempotency_key not in planned
        and (run.deadline_at is None or run.deadline_at > now)
    ]
