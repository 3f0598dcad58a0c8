"""Spend ceilings: how much a routine may spend per period, and what to do about it.

Everything here is pure (STYLE "Catch-up, lateness and ceiling decisions are
pure functions too"): the caller reads the clock and the usage, these
functions decide, the beat tick and the worker carry the decision out.

Periods are :mod:`celery_routines.policy.periods`.

Which runs a period holds
=========================

A run is charged to the period containing its ``created_at``: the instant
beat wrote its row, just before sending it (see
:class:`celery_routines.store.spend_queries.SpendQueries`). For an ordinary
fire that is the window's instant plus the tick's latency. A catch-up replay
or a retry is charged to the period in which it actually goes out, which is
also the period whose end :func:`decide_before_send` suspends the routine
until; charging it to its window (``scheduled_for``) would let a recovery
after a three-day outage spend today from yesterday's budget with nothing to
suspend. Each run that went out costs 1 ``fires`` from the moment its row is
written (``pending``, ``sent`` and ``running`` included), plus whatever else
``spend()`` recorded when it finished. Skipped rows and rows whose message
was never published (reason ``send_failed``) cost nothing.

The overspend bound
===================

Beat checks before each send (:func:`decide_before_send`), the worker after
each run (:func:`decide_after_run`). Several beats and many workers may run
at once. Assuming every send of a routine (windows, retries, operator sends
without ``--force``) is decided by the beat or command holding the routine's
claim, what holds per routine and period is:

* ``fires``: at most ``ceil(limit)`` runs are sent. A run's fire is counted
  from the moment its row is written, before its message goes out, so the
  runs in flight are already in ``used``; and rows are written only under
  the claim (a beat whose claim expired mid-tick writes the same windows
  again, and the unique ``(routine_id, idempotency_key, attempt)`` refuses
  them). The fires total passes the limit only by extra fires tasks report
  themselves with ``spend(n, "fires")``. Celery's own ``self.retry()`` runs
  the same row again and costs no second fire.
* any other unit (money, emails): a run's amount is known only when it
  finishes. Let X be the run whose recorded spend first makes
  ``used >= limit``. The period's total is at most ``limit`` plus the amounts
  of the runs in flight (``pending``/``sent``/``running``) when X's finish
  was committed, X included, plus the runs of the one tick that read the
  usage just before that commit (1 window, or up to ``catch_up_cap`` in a
  recovery; none with ``overlap="skip"``, since X was still open when that
  tick looked). From the commit on, every before-send check sees the limit
  crossed, so nothing more is sent in the period, whether or not the worker
  has written the suspension yet. With ``overlap="skip"`` (the default) and
  no recovery in progress, at most one run is in flight, so the overspend
  is at most X's own amount.
* a run lost by a killed worker records no spend: it counts as 1 fire and
  nothing else, so its real cost is invisible to the ceiling.
* a run's period is read on the clock of the beat that wrote it; beats
  whose clocks disagree by s seconds may charge a run written within s of a
  period edge to the neighbouring period.

Suspension
==========

On exhaustion the routine is suspended until the end of the exhausted
period, that is the start of the next one (the latest such end when several
ceilings are exhausted at once, since it may resume only when all have
reset). The windows inside the suspension are summarised as one ``skipped``
row with reason ``ceiling`` and the routine's next window becomes the first
at or after the period turns, so it resumes by itself: :func:`limit_plan`
when the before-send check suspends, :func:`plan_suspended` when a routine
suspended by the worker's after-run check falls due.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from celery_routines.errors import ScheduleError
from celery_routines.policy.catch_up import FirePlan, SkippedWindows
from celery_routines.policy.cost import FIRES
from celery_routines.policy.periods import PERIODS, period_bounds, zone_of
from celery_routines.policy.states import Reason
from celery_routines.schedules.base import Schedule, count_windows, last_windows
from celery_routines.schedules.zones import aware_utc

__all__ = [
    "FIRES",
    "PERIODS",
    "Ceiling",
    "CeilingDecision",
    "SuspendedPlan",
    "Suspension",
    "decide_after_run",
    "decide_before_send",
    "limit_plan",
    "parse_ceilings",
    "period_bounds",
    "plan_suspended",
    "suspension_reason",
]

UNIT_MAX_LENGTH = 32
CEILING_REASON = Reason.CEILING
"""The ``reason`` of the skipped row summarising a suspension's windows."""

# Amounts are decimal money reported as floats: ten runs of 0.1 must reach a
# limit of 1.0 even though 0.1 has no exact binary value.
_RELATIVE_TOLERANCE = 1e-9
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class Ceiling:
    """At most ``limit`` of ``unit`` per ``per`` (hour, day, ISO week, calendar month)."""

    limit: float
    per: str = "day"
    unit: str = FIRES

    def __post_init__(self) -> None:
        limit = self.limit
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit <= 0
        ):
            raise ScheduleError(f"ceiling limit must be a positive number, got {limit!r}")
        if self.per not in PERIODS:
            raise ScheduleError(
                f"ceiling period {self.per!r} is unknown; use one of {', '.join(PERIODS)}"
            )
        if not isinstance(self.unit, str) or not self.unit or len(self.unit) > UNIT_MAX_LENGTH:
            raise ScheduleError(
                f"ceiling unit must be a non-empty string of at most {UNIT_MAX_LENGTH} "
                f"characters, got {self.unit!r}"
            )

    def as_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "per": self.per, "unit": self.unit}

    def describe(self) -> str:
        """``100 fires/day``."""
        return f"{_number(self.limit)} {self.unit}/{self.per}"


# -- stored rows ---------------------------------------------------------------

_CEILING_KEYS = frozenset({"limit", "per", "unit"})


def parse_ceilings(json_text: str | None) -> tuple[Ceiling, ...]:
    """The ceilings stored in ``routines.ceiling``; empty for NULL.

    The column holds a JSON list of ``{"limit", "per", "unit"}`` objects
    (``per`` defaults to ``"day"``, ``unit`` to ``"fires"``). A single object
    is accepted too, since that is what someone writing the row by hand
    means. Anything else raises :class:`ScheduleError` naming the bad value,
    so the tick can mark the routine invalid instead of firing it unchecked.
    """
    if json_text is None or not json_text.strip():
        return ()
    try:
        value = json.loads(json_text)
    except ValueError as exc:
        raise ScheduleError(f"ceiling is not valid JSON ({exc}): {json_text!r}") from None
    if value is None:
        return ()
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list):
        raise ScheduleError(
            'ceiling must be a JSON list of {"limit": ..., "per": ..., "unit": ...} objects, '
            f"got {json_text!r}"
        )
    ceilings = []
    for item in items:
        if not isinstance(item, dict):
            raise ScheduleError(
                f'each ceiling must be a JSON object like {{"limit": 100, "per": "day"}}, '
                f"got {item!r}"
            )
        unknown = set(item) - _CEILING_KEYS
        if unknown:
            raise ScheduleError(
                f"ceiling {item!r} has unknown key(s) {', '.join(sorted(unknown))}; "
                "use limit, per and unit"
            )
        if "limit" not in item:
            raise ScheduleError(f"ceiling {item!r} has no limit")
        ceilings.append(
            Ceiling(item["limit"], per=item.get("per", "day"), unit=item.get("unit", FIRES))
        )
    return one_per_unit(ceilings)


def one_per_unit(ceilings: Sequence[Ceiling]) -> tuple[Ceiling, ...]:
    """The ceilings, refused when two count the same unit (which one would win?)."""
    units = [c.unit for c in ceilings]
    if len(units) != len(set(units)):
        raise ScheduleError(f"at most one ceiling per unit, got units {units!r}")
    return tuple(ceilings)


# -- decisions -----------------------------------------------------------------


@dataclass(frozen=True)
class Suspension:
    """The routine spent its ceiling: suspend it until ``until``."""

    ceiling: Ceiling
    """The exhausted ceiling whose period ends last."""
    used: float
    """How much of the ceiling's unit its period has used (may pass the limit)."""
    until: datetime
    """The start of the next period (aware UTC): ``routines.suspended_until``."""
    reason: str
    """``routines.suspended_reason``, see :func:`suspension_reason`."""


@dataclass(frozen=True)
class CeilingDecision:
    """What the before-send check allows."""

    send: int
    """How many of the wanted windows may go out now (0 when a ceiling is reached)."""
    suspension: Suspension | None = None
    """Set when the routine must be suspended: a ceiling was already reached,
    or the fires sent now reach it."""

    @property
    def suspend(self) -> bool:
        return self.suspension is not None


def decide_before_send(
    ceilings: Sequence[Ceiling],
    used: Mapping[str, float],
    now: datetime,
    timezone: str | ZoneInfo,
    *,
    wanted: int = 1,
) -> CeilingDecision:
    """Beat's check before sending ``wanted`` windows of a routine at ``now``.

    ``used[unit]`` is what the period of that unit's ceiling holding ``now``
    has used so far, in-flight runs included (``SpendQueries.used_by_ceiling``).
    A reached ceiling (``used >= limit``) sends nothing. A ``fires`` ceiling
    also caps the count: each window sent costs one fire, so with 98 of 100
    used only 2 of 5 wanted windows go out. When the fires sent now reach the
    limit the routine is suspended at once rather than on its next window.
    """
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
        raise ValueError(f"wanted must be a non-negative integer, got {wanted!r}")
    now = aware_utc(now, "now")
    send = wanted
    for ceiling in ceilings:
        spent = _amount(used, ceiling.unit)
        if _reached(spent, ceiling.limit):
            send = 0
        elif ceiling.unit == FIRES:
            # Send while the fires used before each send stay under the limit.
            send = min(send, math.ceil(ceiling.limit - spent - _tolerance(ceiling.limit)))
    exhausted = []
    for ceiling in ceilings:
        after = _amount(used, ceiling.unit) + (send if ceiling.unit == FIRES else 0)
        if _reached(after, ceiling.limit):
            exhausted.append((ceiling, after, period_bounds(now, ceiling.per, timezone)[1]))
    return CeilingDecision(send=send, suspension=_suspension(exhausted, timezone))


def decide_after_run(
    ceilings: Sequence[Ceiling],
    used: Mapping[str, float],
    now: datetime,
    timezone: str | ZoneInfo,
    *,
    charged_at: datetime | None = None,
) -> Suspension | None:
    """The worker's check after a run finished and its spend was recorded.

    ``charged_at`` is the run's ``created_at`` (default ``now``): the run's
    spend belongs to the periods holding it, and ``used`` must be read for
    those periods. A period that already ended by ``now`` suspends nothing,
    since the next one has a fresh budget.
    """
    now = aware_utc(now, "now")
    charged_at = aware_utc(charged_at, "charged_at") if charged_at is not None else now
    exhausted = []
    for ceiling in ceilings:
        spent = _amount(used, ceiling.unit)
        if _reached(spent, ceiling.limit):
            end = period_bounds(charged_at, ceiling.per, timezone)[1]
            if end > now:
                exhausted.append((ceiling, spent, end))
    return _suspension(exhausted, timezone)


def suspension_reason(
    ceiling: Ceiling, used: float, until: datetime, timezone: str | ZoneInfo
) -> str:
    """``ceiling 100 fires/day reached (100 used); resumes 2026-12-01 00:00 CET (Europe/Rome)``."""
    zone = zone_of(timezone)
    local = aware_utc(until, "until").astimezone(zone)
    return (
        f"ceiling {ceiling.describe()} reached ({_number(used)} used); "
        f"resumes {local:%Y-%m-%d %H:%M} {local.tzname()} ({zone.key or zone})"
    )


def _suspension(
    exhausted: Sequence[tuple[Ceiling, float, datetime]], timezone: str | ZoneInfo
) -> Suspension | None:
    if not exhausted:
        return None
    # The routine may resume only once every exhausted ceiling has reset;
    # on a tie the first declared ceiling names the reason.
    ceiling, spent, until = max(exhausted, key=lambda item: item[2])
    return Suspension(ceiling, spent, until, suspension_reason(ceiling, spent, until, timezone))


def _amount(used: Mapping[str, float], unit: str) -> float:
    return float(used.get(unit, 0.0))


def _tolerance(limit: float) -> float:
    return abs(limit) * _RELATIVE_TOLERANCE


def _reached(spent: float, limit: float) -> bool:
    return spent >= limit - _tolerance(limit)


def _number(value: float) -> str:
    """``100`` rather than ``100.0``; ``0.36`` rather than ``0.36000000000000004``."""
    if float(value).is_integer():
        return str(int(value))
    return repr(round(float(value), 9))


# -- the windows of a suspension -----------------------------------------------


@dataclass(frozen=True)
class SuspendedPlan:
    """What a tick does with a suspended routine."""

    skipped: SkippedWindows | None
    """The windows in ``[due_window, until)``, one ``skipped`` row with reason
    ``ceiling``; ``None`` when none falls inside the suspension."""
    next_run_at: datetime
    """The first window at or after ``until``: the routine resumes by itself."""

    def as_fire_plan(self) -> FirePlan:
        """The same answer in the catch-up planner's shape, for the tick."""
        skipped = (self.skipped,) if self.skipped is not None else ()
        return FirePlan(send=(), skipped=skipped, next_run_at=self.next_run_at)


def plan_suspended(schedule: Schedule, due_window: datetime, until: datetime) -> SuspendedPlan:
    """Skip a suspended routine's windows up to ``until`` (``suspended_until``).

    Counting is arithmetic for our schedules (``count_windows``), so a long
    suspension of a one-minute routine costs the same as a short one. A
    window exactly at ``until`` is not skipped: the period turned, it fires.
    """
    due_window = aware_utc(due_window, "due_window")
    until = aware_utc(until, "until")
    if due_window >= until:
        return SuspendedPlan(skipped=None, next_run_at=due_window)
    # Windows are microsecond instants, so (a, until - 1us] is (a, until).
    inside = until - _MICROSECOND
    later = count_windows(schedule, due_window, inside)
    last = last_windows(schedule, due_window, inside, 1) if later else [due_window]
    skipped = SkippedWindows(CEILING_REASON, 1 + later, due_window, last[-1])
    # Continue the chain from the last skipped window, as the catch-up planner
    # does: an interval stays on its grid, a cron gives the same instant.
    next_run_at = aware_utc(schedule.next_after(last[-1]), "next_after")
    return SuspendedPlan(skipped=skipped, next_run_at=next_run_at)


def limit_plan(plan: FirePlan, decision: CeilingDecision, schedule: Schedule) -> FirePlan:
    """Cut the catch-up planner's ``plan`` to what the before-send check allows.

    ``decision`` is :func:`decide_before_send` with ``wanted=len(plan.send)``.
    The oldest ``decision.send`` windows go out, in order, while the budget
    lasts. When the routine is suspended, the planned windows held back and
    every later window before the suspension ends become one ``ceiling``
    summary (contiguous: all come after the last window sent), and the next
    window is the first at or after the period turns, so the routine resumes
    by itself and nothing stays due meanwhile.
    """
    kept, held = plan.send[: decision.send], plan.send[decision.send :]
    suspension = decision.suspension
    if suspension is None:
        if held:
            raise ValueError(
                f"the decision sends {decision.send} of {len(plan.send)} planned windows "
                "without suspending; decide with wanted=len(plan.send)"
            )
        return plan
    after = plan_suspended(schedule, plan.next_run_at, suspension.until)
    windows = [*held]
    count = len(held)
    if after.skipped is not None:
        windows += [after.skipped.first, after.skipped.last]
        count += after.skipped.count
    skipped = plan.skipped
    if count:
        skipped = (*skipped, SkippedWindows(CEILING_REASON, count, windows[0], windows[-1]))
    return FirePlan(send=kept, skipped=skipped, next_run_at=after.next_run_at)
