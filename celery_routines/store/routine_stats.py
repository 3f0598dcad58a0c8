"""A routine's record in ONE statement (issue 33, item 5), and the figures
the routine list sorts by.

The statement reads the routine's runs written in the longer of the period
and the 30-day strip: a range scan of ``ix_routine_runs_routine_created``
(``routine_id, created_at``), whatever the length of the history. One CTE
names each run's figures (its day of the strip, its duration, its lateness,
whether its window ended with it); a UNION ALL of small aggregates over it
answers everything:

- counts grouped by state and reason over the period (retries, skipped windows
  and ended windows summed in the same groups);
- counts grouped by strip day and state;
- the percentiles: PostgreSQL's ``percentile_cont``; SQLite and MariaDB have
  none, so each value is ranked with ``ROW_NUMBER() OVER (ORDER BY value)``
  and only the rows within one rank of each percentile's position come back
  (at most 3 per percentile), which :func:`~celery_routines.policy.run_stats.
  percentile` interpolates exactly as ``percentile_cont`` does.

The days of the strip are local midnights in the routine's zone computed in
Python (:func:`~celery_routines.policy.run_stats.strip_days`) and bound as
UTC instants: the bucket is a CASE over them, the same on every database and
right across DST nights.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    Float,
    Integer,
    String,
    and_,
    case,
    cast,
    exists,
    func,
    literal_column,
    not_,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from ..policy.run_stats import ENDED_STATES, PERCENTILES, Spread, StateCount, percentile
from ..policy.states import RunState
from .connections import connections_for
from .models import RoutineRun

runs = RoutineRun.__table__

# The spreads the record measures, by name.
SPREADS = ("duration", "send_lateness", "start_lateness")
# A trigger's key (``name@manual:<uuid>``): no window, so no lateness.
MANUAL_KEY = "%@manual:%"
# The columns of every arm of the statement, after its kind.
COLUMNS = (
    *("state", "reason", "bucket", "runs", "windows", "ended"),
    *("retry_attempts", "celery_retries", "value", "rank"),
)


class seconds_between(FunctionElement[float]):
    """``later - earlier`` in seconds, as a float, on each database."""

    type = Float()
    inherit_cache = True
    name = "seconds_between"


@compiles(seconds_between, "postgresql")
def _seconds_pg(element: Any, compiler: Any, **kw: Any) -> str:
    later, earlier = (compiler.process(arg, **kw) for arg in element.clauses)
    return f"EXTRACT(EPOCH FROM ({later} - {earlier}))"


@compiles(seconds_between, "sqlite")
def _seconds_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    later, earlier = (compiler.process(arg, **kw) for arg in element.clauses)
    return f"((julianday({later}) - julianday({earlier})) * 86400.0)"


@compiles(seconds_between)
def _seconds_mysql(element: Any, compiler: Any, **kw: Any) -> str:
    later, earlier = (compiler.process(arg, **kw) for arg in element.clauses)
    return f"(TIMESTAMPDIFF(MICROSECOND, {earlier}, {later}) / 1000000.0)"


def _window_first_attempt() -> ColumnElement[bool]:
    """A scheduled window's first attempt: the only rows with a lateness."""
    return and_(runs.c.attempt == 1, not_(runs.c.idempotency_key.like(MANUAL_KEY)))


def _ended() -> ColumnElement[int]:
    """1 when the run ended its window: a final state and no later attempt
    (a failed attempt that beat retried is settled ``failed`` too)."""
    later = runs.alias("later")
    retried = exists().where(
        later.c.routine_id == runs.c.routine_id,
        later.c.idempotency_key == runs.c.idempotency_key,
        later.c.attempt == runs.c.attempt + 1,
    )
    # A success is never retried: only failures pay the look-up (an index
    # probe of uq_routine_runs_window_attempt each).
    failed = and_(runs.c.state.in_(ENDED_STATES), not_(retried))
    return case((runs.c.state == RunState.SUCCEEDED.value, 1), (failed, 1), else_=0)


def _bucket(day_ends: list[datetime]) -> ColumnElement[Any]:
    """The strip day (0 oldest) of a run written after the strip began: the
    first day whose end is after it (the query stops at the last end)."""
    whens = [(runs.c.created_at < end, index) for index, end in enumerate(day_ends[:-1])]
    return case(*whens, else_=len(day_ends) - 1)


class RoutineStatsQueries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.db = connections_for(engine)
        self._percentile_cont = engine.dialect.name == "postgresql"

    def stats_select(
        self, routine_id: int, since: datetime, until: datetime, bounds: list[datetime]
    ) -> Any:
        """The one statement: rows of (kind, state, reason, bucket, runs,
        windows, ended, retry_attempts, celery_retries, value, rank)."""
        started = min(since, bounds[0])
        windows = case(
            (runs.c.state == RunState.SKIPPED.value, func.coalesce(runs.c.skipped_count, 1)),
            else_=1,
        )
        first = _window_first_attempt()
        picked = (
            select(
                runs.c.state,
                runs.c.reason,
                runs.c.attempt,
                runs.c.celery_retries,
                windows.label("windows"),
                _ended().label("ended"),
                case((runs.c.created_at >= since, 1), else_=0).label("in_period"),
                # bounds[0] is the strip's first midnight: before it, NULL.
                case((runs.c.created_at < bounds[0], null()), else_=_bucket(bounds[1:])).label(
                    "bucket"
                ),
                case(
                    (
                        and_(runs.c.started_at.is_not(None), runs.c.finished_at.is_not(None)),
                        seconds_between(runs.c.finished_at, runs.c.started_at),
                    ),
                ).label("duration"),
                case(
                    (
                        and_(first, runs.c.sent_at.is_not(None)),
                        seconds_between(runs.c.sent_at, runs.c.scheduled_for),
                    ),
                ).label("send_lateness"),
                case(
                    (
                        and_(first, runs.c.started_at.is_not(None)),
                        seconds_between(runs.c.started_at, runs.c.scheduled_for),
                    ),
                ).label("start_lateness"),
            )
            .where(
                runs.c.routine_id == routine_id,
                runs.c.created_at >= started,
                runs.c.created_at < until,
            )
            .cte("stats_runs")
        )
        r = picked.c

        def arm(kind: str, *columns: Any) -> list[Any]:
            given = dict(zip(COLUMNS, columns, strict=False))
            typed: dict[str, Any] = {"state": String(16), "reason": String(255), "value": Float()}
            return [
                literal_column(f"'{kind}'").label("kind"),
                *(given.get(n, cast(null(), typed.get(n, Integer()))).label(n) for n in COLUMNS),
            ]

        period = r.in_period == 1
        arms = [
            select(
                *arm(
                    "period",
                    r.state,
                    r.reason,
                    null(),
                    func.count(),
                    func.sum(r.windows),
                    func.sum(r.ended),
                    func.sum(case((r.attempt > 1, 1), else_=0)),
                    func.sum(r.celery_retries),
                )
            )
            .where(period)
            .group_by(r.state, r.reason),
            select(*arm("day", r.state, null(), r.bucket, func.count(), func.sum(r.windows)))
            .where(r.bucket.is_not(None))
            .group_by(r.bucket, r.state),
        ]
        for name in SPREADS:
            value = r[name]
            arms.extend(self._spread_arms(name, picked, value, period))
        return union_all(*arms)

    def _spread_arms(self, name: str, picked: Any, value: Any, period: Any) -> list[Any]:
        nothing: list[Any] = [
            cast(null(), String(16)),
            cast(null(), String(255)),
            cast(null(), Integer()),
        ]
        kind: Any = literal_column(f"'{name}'").label("kind")
        if self._percentile_cont:
            return [
                select(
                    kind,
                    *nothing,
                    func.count(value),
                    *[cast(null(), Integer())] * 4,
                    func.percentile_cont(fraction).within_group(value),
                    literal_column(str(int(fraction * 100))),
                ).where(period)
                for fraction in PERCENTILES
            ]
        ranked = (
            select(
                value.label("value"),
                (func.row_number().over(order_by=value) - 1).label("rank"),
                func.count().over().label("n"),
            )
            .where(period, value.is_not(None))
            .subquery(f"ranked_{name}")
        )
        near = or_(
            *(
                ranked.c.rank.between(
                    (ranked.c.n - 1) * fraction - 1, (ranked.c.n - 1) * fraction + 1
                )
                for fraction in PERCENTILES
            )
        )
        return [
            select(
                kind,
                *nothing,
                ranked.c.n,
                *[cast(null(), Integer())] * 4,
                ranked.c.value,
                ranked.c.rank,
            ).where(near)
        ]

    def stats(
        self, routine_id: int, since: datetime, until: datetime, bounds: list[datetime]
    ) -> tuple[list[StateCount], dict[str, Spread], list[tuple[int, str, int]]]:
        """(groups over the period, spreads by name, strip counts as
        (day index, state, windows)) for runs written in ``[since, until)``
        and in the strip days that begin at ``bounds`` (one more bound than
        days: the last is the end of today)."""
        groups: list[StateCount] = []
        strip: list[tuple[int, str, int]] = []
        percentiles: dict[str, dict[int, float]] = defaultdict(dict)
        ranked: dict[str, dict[int, float]] = defaultdict(dict)
        counts: dict[str, int] = {}
        with self.db.read() as conn:
            rows = conn.execute(self.stats_select(routine_id, since, until, bounds)).all()
        for row in rows:
            if row.kind == "period":
                groups.append(
                    StateCount(
                        row.state,
                        row.reason,
                        int(row.runs),
                        int(row.windows),
                        int(row.ended),
                        int(row.retry_attempts),
                        int(row.celery_retries),
                    )
                )
            elif row.kind == "day":
                strip.append((int(row.bucket), row.state, int(row.windows)))
            else:
                counts[row.kind] = int(row.runs or 0)
                if row.value is None:
                    continue
                target = percentiles if self._percentile_cont else ranked
                target[row.kind][int(row.rank)] = float(row.value)
        return groups, self._spreads(counts, percentiles, ranked), strip

    def _spreads(
        self,
        counts: dict[str, int],
        percentiles: dict[str, dict[int, float]],
        ranked: dict[str, dict[int, float]],
    ) -> dict[str, Spread]:
        found: dict[str, Spread] = {}
        for name in SPREADS:
            count = counts.get(name, 0)
            if count == 0:
                found[name] = Spread()
            elif self._percentile_cont:
                p50, p95 = (percentiles[name].get(int(f * 100)) for f in PERCENTILES)
                found[name] = Spread(_round(p50), _round(p95), count)
            else:
                p50, p95 = (percentile(ranked[name], count, f) for f in PERCENTILES)
                found[name] = Spread(_round(p50), _round(p95), count)
        return found


def _round(seconds: float | None) -> float | None:
    """To the millisecond: SQLite keeps instants to the millisecond, and its
    julianday() differences are exact to ~50 µs."""
    return None if seconds is None else round(seconds, 3)


# The figures the routine list sorts by, and the order each sorts in: the
# worst first, routines without a figure last, then by name.
LIST_SORTS = ("failure_rate", "lateness")


def list_figures(since: datetime) -> Any:
    """Per routine, over the runs written since ``since`` (a range scan of
    ``ix_routine_runs_created``): the failure rate of its ended windows and
    the mean lateness of its windows' sends, to join to a page of routines."""
    ended = _ended()
    failed = case((and_(ended == 1, runs.c.state != RunState.SUCCEEDED.value), 1), else_=0)
    late = case(
        (
            and_(_window_first_attempt(), runs.c.sent_at.is_not(None)),
            seconds_between(runs.c.sent_at, runs.c.scheduled_for),
        )
    )
    return (
        select(
            runs.c.routine_id,
            (cast(func.sum(failed), Float()) / func.nullif(func.sum(ended), 0)).label(
                "failure_rate"
            ),
            func.avg(late).label("lateness"),
        )
        .where(runs.c.created_at >= since)
        .group_by(runs.c.routine_id)
        .subquery("figures")
    )
