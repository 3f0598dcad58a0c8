"""Ceiling queries: what a routine spent in a period, and its suspension.

Which runs a period holds
-------------------------
A run is charged to the period holding its ``created_at``, the instant beat
wrote its row just before publishing it (why not ``scheduled_for``: see the
module docstring of :mod:`celery_routines.ceilings`). That also makes the
query an index range scan: ``ix_routine_runs_routine_created`` is
``(routine_id, created_at)``, so :meth:`SpendQueries.used` reads exactly the
routine's rows of the period and nothing else. No new index is needed.

What a run costs
----------------
Every row that went out costs 1 ``fires`` from the moment it is written:
``pending``, ``sent`` and ``running`` rows count, so the before-send check
sees the runs in flight. A finished run adds what its ``spend`` JSON recorded
(``{"fires": 1, "eur": 0.12}``, written by the worker at finish). ``skipped``
rows and rows whose message was never published (reason ``send_failed``,
``retrying`` or ``failed``; the worker refuses to start them) cost nothing. A ``spend``
value that is not a JSON object of non-negative numbers (a hand-edited row)
costs 1 fire and is logged, so one bad row cannot stop the beat (the rule:
:mod:`celery_routines.policy.cost`).

Summing JSON on SQLite and PostgreSQL
-------------------------------------
The two databases spell JSON functions differently, so the database groups
the period's rows by their ``spend`` text and counts them, and Python parses
each distinct text once and multiplies. A routine that reports no spend
(``{"fires": 1}`` or NULL) comes back as one or two groups however many runs
it had; one reporting varying amounts comes back as at most one group per run
of the period, still bounded by the index range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import ColumnElement, Engine, Select, and_, func, or_, select, update

from ..policy.ceilings import Ceiling, period_bounds
from ..policy.cost import usage
from ..policy.states import Reason
from .connections import connections_for
from .dialects import is_mysql
from .models import ROUTINE_RUNS, ROUTINES

runs = ROUTINE_RUNS
routines = ROUTINES

# A run whose message the broker refused (reason ``send_failed``), whether it
# is then ``retrying`` or ``failed``: nothing went out, and the worker refuses
# to start such a row even if the message arrived after all, so nothing was spent.
SEND_FAILED = Reason.SEND_FAILED

COSTS: ColumnElement[bool] = and_(
    runs.c.state != "skipped",
    # IS NULL spelled out: reason <> 'send_failed' is NULL, not true, for a NULL reason.
    or_(runs.c.reason.is_(None), runs.c.reason != SEND_FAILED),
)


@dataclass(frozen=True)
class RunCeiling:
    """What the after-run check needs of a run and its routine."""

    routine_id: int
    routine_name: str
    # The instant the run is charged at (see the module docstring).
    created_at: datetime
    # The routine's JSON ceilings (NULL: none) and timezone (NULL: the default).
    ceiling: str | None
    timezone: str | None


class SpendQueries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.db = connections_for(engine)

    # -- the run being checked -----------------------------------------------

    def run_ceiling(self, run_id: str) -> RunCeiling | None:
        """The run's routine and charge instant with the routine's ceiling, in
        one primary-key read: the worker makes it after every finished run,
        whether or not the routine has a ceiling. None for an unknown run."""
        query = (
            select(
                runs.c.routine_id,
                routines.c.name.label("routine_name"),
                runs.c.created_at,
                routines.c.ceiling,
                routines.c.timezone,
            )
            .join(routines, routines.c.id == runs.c.routine_id)
            .where(runs.c.id == run_id)
        )
        with self.db.read() as conn:
            row = conn.execute(query).first()
        return RunCeiling(**row._mapping) if row is not None else None

    # -- usage ---------------------------------------------------------------

    def used_select(self, routine_id: int, start: datetime, end: datetime) -> Select[Any]:
        """The usage query: a range scan of ``(routine_id, created_at)``."""
        return (
            select(runs.c.spend, func.count().label("runs"))
            .where(
                runs.c.routine_id == routine_id,
                runs.c.created_at >= start,
                runs.c.created_at < end,
                COSTS,
            )
            .group_by(runs.c.spend)
        )

    def used(self, routine_id: int, start: datetime, end: datetime) -> dict[str, float]:
        """Units spent by the routine's runs created in ``[start, end)``.

        Always has ``"fires"`` (0.0 when nothing went out).
        """
        with self.db.read() as conn:
            groups = conn.execute(self.used_select(routine_id, start, end)).all()
        return usage(groups)

    def used_by_ceiling(
        self,
        routine_id: int,
        ceilings: Sequence[Ceiling],
        instant: datetime,
        timezone: str | ZoneInfo,
    ) -> dict[str, float]:
        """For each ceiling, its unit's usage in its period holding ``instant``.

        The ``used`` argument of ``decide_before_send`` (``instant`` = now) and
        ``decide_after_run`` (``instant`` = the run's ``created_at``). One
        query per distinct period: ceilings sharing a period share it.
        """
        by_period: dict[tuple[datetime, datetime], dict[str, float]] = {}
        used: dict[str, float] = {}
        for ceiling in ceilings:
            bounds = period_bounds(instant, ceiling.per, timezone)
            if bounds not in by_period:
                by_period[bounds] = self.used(routine_id, *bounds)
            used[ceiling.unit] = by_period[bounds].get(ceiling.unit, 0.0)
        return used

    # -- suspension ----------------------------------------------------------

    def suspend(self, routine_id: int, until: datetime, reason: str, now: datetime) -> bool:
        """Suspend the routine until ``until``; False if it already is for longer.

        Several workers may exhaust ceilings at once: the latest end wins, so
        a short suspension never cuts a longer one short.
        """
        stmt = (
            update(routines)
            .where(
                routines.c.id == routine_id,
                or_(routines.c.suspended_until.is_(None), routines.c.suspended_until < until),
            )
            .values(suspended_until=until, suspended_reason=reason, updated_at=now)
        )
        with self.db.write() as conn:
            return conn.execute(stmt).rowcount == 1

    def lift_expired(self, routine_ids: Sequence[int], now: datetime) -> set[int]:
        """Clear the suspensions of these routines that ended by ``now``.

        Meant for the routines a tick claimed (primary-key lookups), not a
        scan of every routine: a suspended routine's next window is the first
        at or after its suspension's end, so the tick that claims it is the
        one that finds the suspension over. Returns the ids lifted.
        """
        if not routine_ids:
            return set()
        ended = (routines.c.id.in_(list(routine_ids)), routines.c.suspended_until <= now)
        lift = update(routines).values(suspended_until=None, suspended_reason=None, updated_at=now)
        if is_mysql(self.engine):
            # No RETURNING: lock the rows whose suspension ended, lift those.
            with self.db.write() as conn:
                found = select(routines.c.id).where(*ended).with_for_update()
                ids = {row.id for row in conn.execute(found)}
                if ids:
                    conn.execute(lift.where(routines.c.id.in_(ids)))
                return ids
        with self.db.write() as conn:
            return {row.id for row in conn.execute(lift.where(*ended).returning(routines.c.id))}
