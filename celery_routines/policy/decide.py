"""What one tick does with each claimed routine: a pure decision.

The engine reads (the claimed rows, the ceiling usage of the routines that
would send, their open runs, a dead beat's rows of their due windows), then
asks this module, then writes what it answers and sends after the commit.
Nothing here touches the store, the broker, Celery or the clock: ``now`` is an
argument, and run ids come from ``new_id`` (random by default, fixed in tests).

Catch-up, lateness, ceilings, overlap and takeover meet here, in this order:

1. :func:`plan`: the catch-up planner's windows, the overlap policy applied
   among them (a recovery under ``skip``/``queue``/``replace`` sends one), or,
   for a suspended routine, one ``ceiling`` skip up to the end of its suspension;
2. :func:`decide`: a recovery under ``skip`` settles on a window that a beat
   which gave the routine up already wrote, if it passed one over
   (:func:`~celery_routines.policy.catch_up.resume_written`); then the
   before-send ceiling check cuts the windows (and may
   suspend the routine; windows an open run holds back under ``skip`` or
   ``queue`` spend nothing and suspend nothing), then the overlap policy
   meets the open runs: skip
   them as one ``overlap`` row, queue the routine (it stays due), replace the
   open runs, or send;
3. :func:`take_over`: a due window that a beat whose claim expired already
   wrote is not skipped again; if its row is still ``pending`` it is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Generic

from celery_routines.policy.catch_up import (
    FirePlan,
    SkippedWindows,
    one_at_a_time,
    plan_due,
    resume_written,
    this_tick,
)
from celery_routines.policy.ceilings import (
    Suspension,
    decide_before_send,
    limit_plan,
    plan_suspended,
)
from celery_routines.policy.claimed import (
    Claimed,
    Facts,
    IdFactory,
    OpenRunRowLike,
    Row,
    SharedAnswers,
    WrittenRunLike,
    random_id,
)
from celery_routines.policy.runs import (
    QUEUE_RECHECK,
    NewRun,
    in_progress,
    overlap_action,
    unstarted_timeout,
)
from celery_routines.policy.states import Overlap, Reason, RunState
from celery_routines.schedules.keys import skip_key, window_in_key, window_key

__all__ = [
    "Claimed",
    "Decision",
    "Facts",
    "SharedAnswers",
    "Verdict",
    "decide",
    "needs_usage",
    "plan",
    "random_id",
    "skip_row",
    "take_over",
    "written_key",
]


class Verdict(StrEnum):
    FIRE = "fire"
    """Write the rows, send the sends, move the routine to ``next_run_at``."""
    QUEUED = "queued"
    """``overlap="queue"`` behind an open run: write nothing, look again at
    ``next_run_at`` (the routine stays due, held by this beat)."""
    RESUMED = "resumed"
    """It was invalid and reads again: resume from ``next_run_at`` (after
    now), without treating the retry instant as a missed window."""


@dataclass(frozen=True)
class Decision(Generic[Row]):
    claimed: Claimed[Row]
    verdict: Verdict
    next_run_at: datetime
    sends: tuple[NewRun, ...] = ()
    """The runs to write and send (for ``QUEUED``: the windows that wait; nothing is written)."""
    skips: tuple[NewRun, ...] = ()
    suspension: Suspension | None = None
    """Set when a ceiling is reached: suspend until ``suspension.until``."""
    planned: int = 0
    """How many windows the plan wanted to send before the ceiling check."""
    replace: tuple[str, ...] = ()
    """Open runs to close and revoke for the new window (``overlap="replace"``)."""
    holding: tuple[OpenRunRowLike, ...] = ()
    """The open runs that held the windows back (skip, queue, replace)."""
    waiting: int = 0
    """Planned windows left due for the next ticks (see ``FirePlan.waiting``)."""
    resent: WrittenRunLike | None = None
    """A dead beat's row of the due window, taken over by :func:`take_over`."""


# -- 1. the plan ---------------------------------------------------------------------


def plan(
    claimed: Claimed[Row],
    now: datetime,
    most_per_tick: int | None = None,
    answers: SharedAnswers | None = None,
) -> FirePlan:
    """The windows of a due routine, at most ``most_per_tick`` of them this
    tick (``routines_catch_up_per_tick``), shared through ``answers`` with
    routines that plan alike. Raises ScheduleError for a schedule that does
    not move forward (the routine is then marked invalid)."""
    record, routine = claimed.record, claimed.routine
    if record.suspended_until is not None and record.suspended_until > now:
        suspended = plan_suspended(claimed.schedule, claimed.due, record.suspended_until)
        return suspended.as_fire_plan()
    # A jittered routine's windows go out `offset` after them: planning them
    # at `now - offset` measures due-ness and lateness from the send instants.
    due, at = claimed.due, now - claimed.offset
    schedule = claimed.schedule
    options = (routine.catch_up, routine.catch_up_cap, routine.max_lateness, routine.overlap)
    # plan_due is pure: routines that share a schedule object (schedule_of
    # shares them), a due window, an instant and the options share a plan
    # (frozen). Only UTC instants are looked up (see SharedAnswers).
    key = (id(schedule), due, at, most_per_tick, *options)
    shared = answers if due.tzinfo is UTC and at.tzinfo is UTC else None
    if shared is not None:
        found = shared.plan(key, schedule)
        if found is not None:
            return found
    planned = plan_due(
        schedule,
        due,
        at,
        catch_up=routine.catch_up,
        catch_up_cap=routine.catch_up_cap,
        max_lateness=routine.max_lateness,
    )
    # The replayed windows meet the overlap policy among themselves before
    # the ceiling and the open runs are looked at: a ceiling counts only what
    # would go out.
    planned = one_at_a_time(planned, routine.overlap)
    if most_per_tick is not None:
        planned = this_tick(planned, most_per_tick)
    if shared is not None:
        shared.keep_plan(key, schedule, planned)
    return planned


def needs_usage(claimed: Claimed[Row], planned: FirePlan) -> bool:
    """Whether :func:`decide` needs the routine's ceiling usage."""
    return bool(claimed.routine.ceilings and planned.send)


# -- 2. the decision -----------------------------------------------------------------


def decide(
    claimed: Claimed[Row],
    planned: FirePlan | None,
    facts: Facts,
    now: datetime,
    *,
    run_timeout: float,
    start_timeout: float | None = None,
    new_id: IdFactory = random_id,
    answers: SharedAnswers | None = None,
) -> Decision[Row]:
    """What the tick does with ``claimed``; ``planned`` is :func:`plan`'s
    answer (None for a routine that was invalid and reads again).
    ``run_timeout``, ``start_timeout``: the configured defaults; a row it
    writes is lost if no worker claims it within :func:`unstarted_timeout`."""
    answers = answers or SharedAnswers(most=0)
    if planned is None or claimed.record.last_error is not None:
        window = claimed.schedule.next_after(now - claimed.offset)
        return Decision(claimed, Verdict.RESUMED, claimed.send_at(window))
    if claimed.routine.overlap == Overlap.SKIP and facts.open_runs:
        planned = _resume_written(claimed, planned, facts)
    wanted = len(planned.send)
    suspension = None
    if needs_usage(claimed, planned):
        if facts.used is None:
            raise ValueError(f"{claimed.routine.name}: its ceiling usage was not read")
        budget = decide_before_send(
            claimed.routine.ceilings, facts.used, now, claimed.timezone, wanted=wanted
        )
        # Windows an open run then holds back (skip, queue) spend nothing: a
        # ceiling they would have reached is not reached, and nothing is cut.
        held = (
            budget.send and budget.suspension and _held_back(claimed, planned, facts, now, answers)
        )
        if not held:
            suspension = budget.suspension
            planned = limit_plan(planned, budget, claimed.schedule)
    if claimed.offset:
        planned = replace(planned, next_run_at=claimed.send_at(planned.next_run_at))
    record, name, timezone = claimed.record, claimed.routine.name, claimed.timezone
    waits = unstarted_timeout(claimed.routine.run_timeout or run_timeout, start_timeout)
    deadline = answers.lost_deadline(now, facts.offset, waits)
    sends = [
        NewRun(
            id=new_id(),
            routine_id=record.id,
            idempotency_key=answers.window_key(name, window, timezone),
            attempt=1,
            scheduled_for=window,
            deadline_at=deadline,
        )
        for window in planned.send
    ]
    skips = [skip_row(record.id, name, timezone, summary, new_id) for summary in planned.skipped]
    if not sends:
        return Decision(
            claimed,
            Verdict.FIRE,
            planned.next_run_at,
            skips=tuple(skips),
            suspension=suspension,
            planned=wanted,
        )
    return _overlap(claimed, planned, sends, skips, suspension, wanted, facts, now, new_id)


def _resume_written(claimed: Claimed[Row], planned: FirePlan, facts: Facts) -> FirePlan:
    """A recovery under ``skip`` settles on a window a beat that gave the
    routine up already wrote (see :func:`resume_written`)."""
    name = claimed.routine.name
    pending = [
        window
        for run in facts.open_runs
        if run.state == RunState.PENDING
        and (window := window_in_key(name, run.idempotency_key)) is not None
    ]
    return resume_written(planned, pending, claimed.schedule) if pending else planned


def _held_back(
    claimed: Claimed[Row], planned: FirePlan, facts: Facts, now: datetime, answers: SharedAnswers
) -> bool:
    """Whether the overlap policy holds every planned window back (an open
    run, under ``skip`` or ``queue``): :func:`_overlap`'s question, asked
    before the ceiling counts the windows."""
    if not facts.open_runs:
        return False
    name, timezone = claimed.routine.name, claimed.timezone
    keys = {answers.window_key(name, window, timezone) for window in planned.send}
    holding = in_progress(facts.open_runs, keys, now + facts.offset)
    return overlap_action(claimed.routine.overlap, len(holding)) in (Overlap.SKIP, Overlap.QUEUE)


def _overlap(
    claimed: Claimed[Row],
    planned: FirePlan,
    sends: list[NewRun],
    skips: list[NewRun],
    suspension: Suspension | None,
    wanted: int,
    facts: Facts,
    now: datetime,
    new_id: IdFactory,
) -> Decision[Row]:
    # One Decision built per routine (dataclasses.replace costs as much as
    # the rest of the decision: this runs for every claimed routine).
    policy = claimed.routine.overlap
    holding: tuple[OpenRunRowLike, ...] = ()
    if facts.open_runs:
        planned_keys = {run.idempotency_key for run in sends}
        holding = tuple(in_progress(facts.open_runs, planned_keys, now + facts.offset))
    action = overlap_action(policy, len(holding))
    verdict, replaced = Verdict.FIRE, tuple[str, ...]()
    next_run_at, waiting = planned.next_run_at, planned.waiting
    if action == Overlap.SKIP:
        skips = _overlap_skip(claimed, sends, skips, new_id)
        sends = []
    elif action == Overlap.QUEUE:
        # Nothing is written: the routine stays due and the same plan is made
        # again once the open run ends.
        verdict, next_run_at, skips = Verdict.QUEUED, now + QUEUE_RECHECK, []
    elif action == Overlap.REPLACE:
        replaced = tuple(run.id for run in holding)
    return Decision(
        claimed,
        verdict,
        next_run_at,
        sends=tuple(sends),
        skips=tuple(skips),
        suspension=suspension,
        planned=wanted,
        replace=replaced,
        holding=holding,
        waiting=waiting if verdict == Verdict.FIRE else 0,
    )


def skip_row(
    routine_id: int,
    name: str,
    timezone: str,
    summary: SkippedWindows,
    new_id: IdFactory = random_id,
) -> NewRun:
    """One ``skipped`` row for a summary of windows (key: :func:`skip_key`)."""
    return NewRun(
        id=new_id(),
        routine_id=routine_id,
        idempotency_key=skip_key(name, summary.first, summary.last, summary.count, timezone),
        attempt=1,
        scheduled_for=summary.last,
        state=RunState.SKIPPED,
        reason=summary.reason,
        skipped_count=summary.count,
        skipped_first=summary.first,
        skipped_last=summary.last,
    )


def _overlap_skip(
    claimed: Claimed[Row], sends: Sequence[NewRun], skips: list[NewRun], new_id: IdFactory
) -> list[NewRun]:
    """``skips`` with the windows of this tick as one ``skipped`` row, reason
    ``overlap``: the windows a recovery already skipped behind its oldest
    (see :func:`one_at_a_time`) are in the same row, so a tick writes one."""
    first, last, count = sends[0].scheduled_for, sends[-1].scheduled_for, len(sends)
    kept = []
    for skip in skips:
        if skip.reason == Reason.OVERLAP and skip.skipped_last is not None:
            last, count = skip.skipped_last, count + (skip.skipped_count or 1)
        else:
            kept.append(skip)
    summary = SkippedWindows(Reason.OVERLAP, count, first, last)
    kept.append(
        skip_row(claimed.record.id, claimed.routine.name, claimed.timezone, summary, new_id)
    )
    return kept


# -- 3. takeover -----------------------------------------------------------------------


def written_key(decision: Decision[Row]) -> tuple[int, str, int] | None:
    """The due window's row to look up, for a decision that skips the due
    window (a beat that wrote it and died may have left it behind); None
    for the others, which cost no query."""
    if decision.verdict != Verdict.FIRE or not decision.skips:
        return None  # most decisions: no window skipped, nothing to compute
    due = decision.claimed.due
    if not any(skip.skipped_first == due for skip in decision.skips):
        return None
    claimed = decision.claimed
    return (claimed.record.id, window_key(claimed.routine.name, due, claimed.timezone), 1)


def take_over(
    decision: Decision[Row], written: WrittenRunLike, new_id: IdFactory = random_id
) -> Decision[Row]:
    """The due window was already written by a beat whose claim expired: it
    leaves the skipped summary it would have started, and a row still
    ``pending`` (written, perhaps never sent) goes out again through the
    tick's orphan path, under its own run id; the worker's claim on the run
    row makes a repeated delivery harmless."""
    claimed, due = decision.claimed, written.scheduled_for
    skips = list(decision.skips)
    for index, skip in enumerate(skips):
        if skip.skipped_first != due:
            continue
        remaining = (skip.skipped_count or 1) - 1
        if remaining == 0:
            del skips[index]
        else:
            assert skip.skipped_last is not None and skip.reason is not None
            summary = SkippedWindows(
                Reason(skip.reason), remaining, claimed.schedule.next_after(due), skip.skipped_last
            )
            skips[index] = skip_row(
                claimed.record.id, claimed.routine.name, claimed.timezone, summary, new_id
            )
        break
    sends = decision.sends
    if written.state == RunState.PENDING:
        again = NewRun(
            id=new_id(),
            routine_id=written.routine_id,
            idempotency_key=written.idempotency_key,
            attempt=written.attempt,
            scheduled_for=due,
        )
        sends = (again, *sends)
    return replace(decision, sends=sends, skips=tuple(skips), resent=written)
