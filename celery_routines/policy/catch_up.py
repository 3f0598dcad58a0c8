"""The catch-up planner: which due windows go out now and which are skipped.

Pure: the beat tick passes the schedule, the routine's due window and the
instant it read from its clock, and carries out the returned :class:`FirePlan`.
Missed windows are never materialised: a routine that was down for a year
is planned from ``count_windows``/``last_windows`` (arithmetic), so the cost
depends on ``catch_up_cap``, not on the length of the outage.

:func:`one_at_a_time` then applies the overlap policy among the windows of
one plan, so a recovery under ``skip``, ``queue`` or ``replace`` never starts
two bodies of a routine at once: ``skip`` and ``replace`` send the newest
window, ``queue`` sends them all in window order, one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from celery_routines.errors import ScheduleError
from celery_routines.policy.states import CatchUp, Overlap, Reason
from celery_routines.schedules.base import Schedule, count_windows, last_windows
from celery_routines.schedules.zones import aware_utc

__all__ = [
    "FirePlan",
    "SkippedWindows",
    "one_at_a_time",
    "plan_due",
    "resume_written",
    "this_tick",
]


@dataclass(frozen=True)
class SkippedWindows:
    """A run of windows skipped for one reason, summarised in one row."""

    reason: Reason
    """``"catch_up_cap"``, ``"latest"``, ``"skip_to_next"``, ``"late"``, or,
    from :func:`one_at_a_time`, ``"latest"`` (under ``skip``) or ``"replaced"``."""
    count: int
    first: datetime
    """The oldest skipped window (UTC)."""
    last: datetime
    """The newest skipped window (UTC)."""


@dataclass(frozen=True)
class FirePlan:
    """What one tick does for one due routine."""

    send: tuple[datetime, ...]
    """Windows to send now, oldest first (UTC)."""
    skipped: tuple[SkippedWindows, ...]
    """Summaries of skipped windows, at most one per reason, oldest first."""
    next_run_at: datetime
    """The first window strictly after ``now``, on the chain of the due windows
    (an interval stays anchored on its previous windows): the new due time."""
    waiting: int = 0
    """Planned windows left due behind the ones sent, for the next ticks
    (``next_run_at`` is then the oldest of them, not after now): behind the
    one run of ``overlap="queue"``, or beyond :func:`this_tick`'s share."""


def plan_due(
    schedule: Schedule,
    due_window: datetime,
    now: datetime,
    *,
    catch_up: CatchUp = CatchUp.CATCH_UP,
    catch_up_cap: int = 25,
    max_lateness: float | None = None,
) -> FirePlan:
    """Plan a routine whose window ``due_window`` has come (``due_window <= now``).

    The due windows are ``due_window`` plus every window in ``(due_window, now]``.
    One due window is a normal fire. More is a recovery, handled by the
    ``catch_up`` policy: ``"catch_up"`` sends the newest ``catch_up_cap``,
    ``"latest"`` the newest one, ``"skip_to_next"`` none; the rest are
    summarised. A window that would go out more than ``max_lateness`` seconds
    after its time is skipped as ``"late"`` instead of sent.

    The options are a :class:`~celery_routines.policy.routine.Routine`'s,
    checked when it was built.
    """
    due_window = aware_utc(due_window, "due_window")
    now = aware_utc(now, "now")
    if due_window > now:
        # Nothing is due yet; keep the due time as it is.
        return FirePlan(send=(), skipped=(), next_run_at=due_window)

    later = count_windows(schedule, due_window, now)  # due windows after due_window
    total = 1 + later
    if total == 1:
        keep, policy_reason = 1, None
    else:
        keep = {
            CatchUp.CATCH_UP: min(catch_up_cap, total),
            CatchUp.LATEST: 1,
            CatchUp.SKIP_TO_NEXT: 0,
        }[catch_up]
        policy_reason = Reason.CATCH_UP_CAP if catch_up == CatchUp.CATCH_UP else Reason(catch_up)

    # `tail`: the newest `keep` due windows plus, when anything is dropped, the
    # newest dropped one, ascending. Only these are ever listed.
    wanted = min(keep + 1, total)
    tail = last_windows(schedule, due_window, now, min(wanted, later))
    if len(tail) < wanted:  # the oldest wanted window is due_window itself
        tail = [due_window, *tail]
    kept = tail[len(tail) - keep :] if keep else []
    skipped: list[SkippedWindows] = []
    dropped = total - keep
    if dropped and policy_reason is not None:
        newest_dropped = tail[len(tail) - keep - 1]
        skipped.append(SkippedWindows(policy_reason, dropped, due_window, newest_dropped))

    if max_lateness is not None:
        limit = timedelta(seconds=max_lateness)
        late = [w for w in kept if now - w > limit]  # a prefix: `kept` is ascending
        if late:
            skipped.append(SkippedWindows(Reason.LATE, len(late), late[0], late[-1]))
            kept = kept[len(late) :]

    # Continue the chain from the newest due window rather than from `now`: an
    # interval is anchored on its previous window (10:00, 10:05, ... stays on
    # that grid after an outage); for a cron both give the same instant.
    next_run_at = aware_utc(schedule.next_after(tail[-1]), "next_after")
    if next_run_at <= now:
        # Only a schedule whose count disagrees with its own next_after gets
        # here; never let it leave the routine due in a hot loop.
        next_run_at = aware_utc(schedule.next_after(now), "next_after")
    if next_run_at <= now:
        raise ScheduleError(
            f"{schedule.describe()} returned {next_run_at.isoformat()} as the next window "
            f"after {now.isoformat()}; a schedule must move forward"
        )
    return FirePlan(send=tuple(kept), skipped=tuple(skipped), next_run_at=next_run_at)


def one_at_a_time(plan: FirePlan, overlap: Overlap) -> FirePlan:
    """The overlap policy among the windows of one plan (a recovery).

    All of them are due now, so whichever goes out first is still open when
    the next would go out:

    - ``skip``: the newest goes out, as Celery beat sends a missed entry
      once, now; the older ones are passed over for it and become one
      ``latest`` summary (the reason ``catch_up="latest"`` gives the same
      windows): one body, and the one that reflects the present;
    - ``queue``: the oldest goes out; the others stay due (``next_run_at`` is
      the next of them) and go out one by one as each run ends;
    - ``replace``: each window would replace the one before it, so only the
      newest goes out; the older ones become one ``replaced`` summary;
    - ``overlap``: all of them go out (up to ``catch_up_cap``).

    A plan of one window, or none, is returned as it is.
    """
    send = plan.send
    if len(send) < 2 or overlap == Overlap.OVERLAP:
        return plan
    if overlap == Overlap.SKIP:
        passed_over = SkippedWindows(Reason.LATEST, len(send) - 1, send[0], send[-2])
        return replace(plan, send=send[-1:], skipped=(*plan.skipped, passed_over))
    if overlap == Overlap.REPLACE:
        replaced = SkippedWindows(Reason.REPLACED, len(send) - 1, send[0], send[-2])
        return replace(plan, send=send[-1:], skipped=(*plan.skipped, replaced))
    # queue: the rest stays due; the routine is looked at again once the run
    # sent now has ended (the tick's queue rule holds it meanwhile).
    return replace(plan, send=send[:1], next_run_at=send[1], waiting=len(send) - 1)


def resume_written(plan: FirePlan, written: Sequence[datetime], schedule: Schedule) -> FirePlan:
    """A recovery under ``skip`` that passed over a window whose run row is
    already written and still ``pending`` sends that window again instead of
    its newest, and the windows after it collide with it (one ``overlap``
    summary).

    Such a row is left by a beat that wrote its recovery's newest window and
    did not move the routine on (it died, or its claim expired mid-tick); it
    may have published it. The beat taking the routine over plans at its own
    instant, so its newest window can be a later one: sending both could run
    two bodies at once. Sending the written window again goes out under that
    row's own run id (the worker runs a run once), so beats that take a
    routine over from one another settle on one window. ``written``: the
    windows (UTC) of the routine's pending rows; the newest one the recovery
    passed over is taken, and a plan that passed over none of them is
    returned as it is.
    """
    passed = next((s for s in plan.skipped if s.reason == Reason.LATEST), None)
    if passed is None or len(plan.send) != 1:
        return plan
    inside = [w for w in written if passed.first <= w <= passed.last]
    if not inside:
        return plan
    resent, newest = max(inside), plan.send[0]
    older = []
    if passed.first < resent:  # the windows before it stay passed over
        before = resent - _INSTANT
        count = 1 + count_windows(schedule, passed.first, before)
        last = last_windows(schedule, passed.first, before, 1) or [passed.first]
        older.append(SkippedWindows(Reason.LATEST, count, passed.first, last[0]))
    collided = SkippedWindows(
        Reason.OVERLAP,
        count_windows(schedule, resent, newest),
        aware_utc(schedule.next_after(resent), "next_after"),
        newest,
    )
    others = [s for s in plan.skipped if s is not passed]
    return replace(plan, send=(resent,), skipped=(*others, *older, collided))


# The smallest step of time: a window strictly before another.
_INSTANT = timedelta(microseconds=1)


def this_tick(plan: FirePlan, most: int) -> FirePlan:
    """At most ``most`` windows of one routine go out in one tick; the rest
    stay due (``next_run_at`` is the oldest of them) and go out in the next
    ticks, oldest first. A tick that published a whole large catch-up at once
    would hold back every other routine's window due meanwhile until it ended;
    the next tick claims those beside this routine's remaining windows."""
    if len(plan.send) <= most:
        return plan
    send = plan.send
    return replace(
        plan, send=send[:most], next_run_at=send[most], waiting=plan.waiting + len(send) - most
    )
