"""A routine's record in ONE statement (issue 33, item 5), and the figures
the routine list sorts by.

The statement is a UNION ALL of small aggregates, each reading a range of
``ix_routine_runs_routine_created`` (``routine_id, created_at``), whatever
the length of the history:

- a CTE of the period's runs names each one's figures (duration, lateness
  sent and started, whether its window ended with it); over it, counts
  grouped by state and reason (retries, skipped windows and ended windows
  summed in the same groups) and the percentiles: PostgreSQL's
  ``percentile_cont`` over an array (one sort per measure); SQLite and
  MariaDB have none, so each value is ranked with ``ROW_NUMBER() OVER (ORDER
  BY value)`` and only the rows within one rank of each percentile's
  position come back (at most 3 per percentile), which
  :func:`~celery_routines.policy.run_stats.percentile` interpolates exactly
  as ``percentile_cont`` does;
- the 30-day strip reads its own range and computes only each run's local
  day: the local midnights are computed in Python
  (:func:`~celery_routines.policy.run_stats.strip_days`, right across DST
  nights) and bound as UTC instants for a CASE tree, on every database.

Measured at 1,000,000 runs in docs/routine-stats.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Engine,
    Float,
    Integer,
    String,
    Subquery,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    not_,
    null,
    or_,
    select,
    type_coerce,
    union_all,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import FunctionElement

from ..policy.run_stats import (
    ENDED_STATES,
    PERCENTILES,
    STRIP_DAYS,
    Spread,
    StateCount,
    percentile,
)
from ..policy.states import RunState, no_retry
from .connections import connections_for
from .models import ROUTINE_RUNS
from .types import UTCDateTime

runs = ROUTINE_RUNS

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
def _seconds_pg(element: seconds_between, compiler: SQLCompiler, **kw: Any) -> str:
    later, earlier = (compiler.process(arg, **kw) for arg in element.clauses)
    # date_part() is double precision; EXTRACT() is numeric since PostgreSQL
    # 14, and numeric arithmetic over every row cost a third of the statement.
    return f"date_part('epoch', {later} - {earlier})"


@compiles(seconds_between, "sqlite")
def _seconds_sqlite(element: seconds_between, compiler: SQLCompiler, **kw: Any) -> str:
    later, earlier = (compiler.process(arg, **kw) for arg in element.clauses)
    return f"((julianday({later}) - julianday({earlier})) * 86400.0)"


@compiles(seconds_between)
def _seconds_mysql(element: seconds_between, compiler: SQLCompiler, **kw: Any) -> str:
    later, earlier = (compiler.process(arg, **kw) for arg in element.clauses)
    return f"(TIMESTAMPDIFF(MICROSECOND, {earlier}, {later}) / 1000000.0)"


def _window_first_attempt() -> ColumnElement[bool]:
    """A scheduled window's first attempt: the only rows with a lateness."""
    return and_(runs.c.attempt == 1, not_(runs.c.idempotency_key.like(MANUAL_KEY)))


def _ended() -> ColumnElement[int]:
    """1 when the run ended its window: a success, or a failure that was
    not retried. A failed attempt that beat retried was ``retrying`` with a
    ``retry_at`` before it was settled ``failed``/``lost`` (and a final
    failure never has one), unless the retry was then cancelled
    (``no_retry:<why>``: the window ended there). Read from the row itself:
    looking up the next attempt cost an index probe per failure, and a
    third of the statement at 90 days."""
    not_retried = or_(runs.c.retry_at.is_(None), runs.c.reason.like(no_retry("%")))
    return case(
        (runs.c.state == RunState.SUCCEEDED.value, 1),
        (and_(runs.c.state.in_(ENDED_STATES), not_retried), 1),
        else_=0,
    )


def _bucket(
    day_ends: Sequence[ColumnElement[datetime]], low: int = 0, high: int | None = None
) -> ColumnElement[int]:
    """The strip day (0 oldest) of a run written after the strip began: the
    first day whose end is after it (the query stops at the last end).

    A balanced tree of CASEs over the days' ends, so each row pays five
    comparisons, not up to thirty (a flat CASE was half the statement's time
    at 43,000 rows). The ends are local midnights converted in Python: the
    same on every database, right across DST nights."""
    if high is None:
        high = len(day_ends) - 1
    if low == high:
        return literal_column(str(low))
    middle = (low + high) // 2
    return case(
        (runs.c.created_at < day_ends[middle], _bucket(day_ends, low, middle)),
        else_=_bucket(day_ends, middle + 1, high),
    )


class RoutineStatsQueries:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.db = connections_for(engine)
        self._percentile_cont = engine.dialect.name == "postgresql"
        self._statement: CompoundSelect | None = None

    def stats_params(
        self, routine_id: int, since: datetime, until: datetime, bounds: list[datetime]
    ) -> dict[str, object]:
        """The values of :meth:`stats_select`'s parameters."""
        values: dict[str, object] = {
            "routine_id": routine_id,
            "since": since,
            "until": until,
            "strip_start": bounds[0],
        }
        values.update({f"day_end_{i}": end for i, end in enumerate(bounds[1:])})
        return values

    def stats_select(self) -> CompoundSelect:
        """The one statement: rows of (kind, state, reason, bucket, runs,
        windows, ended, retry_attempts, celery_retries, value, rank).

        Built once with named parameters (:meth:`stats_params`): building
        and compiling it each time cost a third of its run at 43,000 rows."""
        if self._statement is None:
            self._statement = self._build()
        return self._statement

    def _build(self) -> CompoundSelect:
        since = bindparam("since", type_=UTCDateTime())
        until = bindparam("until", type_=UTCDateTime())
        strip_start = bindparam("strip_start", type_=UTCDateTime())
        windows = case(
            (runs.c.state == RunState.SKIPPED.value, func.coalesce(runs.c.skipped_count, 1)),
            else_=1,
        )
        first = _window_first_attempt()
        of_routine = [runs.c.routine_id == bindparam("routine_id"), runs.c.created_at < until]
        # The period's runs, with what is measured over them. The strip reads
        # its 30 days in an arm of its own that computes only the day: the
        # per-row figures then cost for the period's rows only (7 days: a
        # quarter of the strip's at 1 run a minute).
        picked = (
            select(
                runs.c.state,
                runs.c.reason,
                runs.c.attempt,
                runs.c.celery_retries,
                windows.label("windows"),
                _ended().label("ended"),
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
            .where(*of_routine, runs.c.created_at >= since)
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

        day = self._day()
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
            ).group_by(r.state, r.reason),
            # The strip, from its first local midnight.
            select(*arm("day", runs.c.state, null(), day, func.count(), func.sum(windows)))
            .where(*of_routine, runs.c.created_at >= strip_start)
            .group_by(day, runs.c.state),
        ]
        if self._percentile_cont:
            arms.extend(self._percentile_cont_arms(picked))
        else:
            for name in SPREADS:
                arms.extend(self._ranked_arms(name, r[name]))
        return union_all(*arms)

    def _day(self) -> ColumnElement[int]:
        """The strip day of a run (0 oldest): a tree of comparisons with the
        days' ends, local midnights computed in Python and bound as UTC
        instants. Measured on PostgreSQL against converting each row into
        the zone there (``timezone(zone, ...)::date``): 37-44 ms against
        48-51 ms at 42,000 rows, the same days, and no second zone database
        to agree with Python's."""
        return _bucket([bindparam(f"day_end_{i}", type_=UTCDateTime()) for i in range(STRIP_DAYS)])

    def _percentile_cont_arms(self, picked: Any) -> list[Any]:
        """PostgreSQL: one aggregate row sorts each measure once for both
        percentiles (``percentile_cont(ARRAY[0.5, 0.95])``), read by one arm
        per measure and percentile."""
        r = picked.c
        fractions: Any = postgresql.array([literal_column(str(f)) for f in PERCENTILES])
        spreads = select(
            *(func.count(r[name]).label(f"{name}_n") for name in SPREADS),
            *(
                type_coerce(
                    func.percentile_cont(fractions).within_group(r[name]),
                    postgresql.ARRAY(Float()),
                ).label(f"{name}_p")
                for name in SPREADS
            ),
        ).cte("stats_spreads")
        return [
            select(
                literal_column(f"'{name}'").label("kind"),
                *_nulls(*KEYLESS),
                spreads.c[f"{name}_n"],
                *_nulls(*UNCOUNTED),
                spreads.c[f"{name}_p"][index + 1],
                literal_column(str(int(fraction * 100))),
            )
            for name in SPREADS
            for index, fraction in enumerate(PERCENTILES)
        ]

    def _ranked_arms(self, name: str, value: Any) -> list[Any]:
        """SQLite and MariaDB: the values within one rank of each
        percentile's position, interpolated in Python."""
        kind: Any = literal_column(f"'{name}'").label("kind")
        ranked = (
            select(
                value.label("value"),
                (func.row_number().over(order_by=value) - 1).label("rank"),
                func.count().over().label("n"),
            )
            .where(value.is_not(None))
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
                *_nulls(*KEYLESS),
                ranked.c.n,
                *_nulls(*UNCOUNTED),
                ranked.c.value,
                ranked.c.rank,
            ).where(near)
        ]

    def stats(
        self,
        routine_id: int,
        since: datetime,
        until: datetime,
        bounds: list[datetime],
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
            params = self.stats_params(routine_id, since, until, bounds)
            rows = conn.execute(self.stats_select(), params).all()
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


def _nulls(*types: Any) -> list[Any]:
    """Typed NULLs for the columns an arm does not fill: a bare NULL in a
    union leaves PostgreSQL guessing the column's type."""
    return [cast(null(), kind) for kind in types]


# The arms' NULL columns: state, reason, bucket; then ended .. celery_retries.
KEYLESS = (String(16), String(255), Integer())
UNCOUNTED = (Integer(),) * 4


def _round(seconds: float | None) -> float | None:
    """To the millisecond: SQLite keeps instants to the millisecond, and its
    julianday() differences are exact to ~50 µs."""
    return None if seconds is None else round(seconds, 3)


# The figures the routine list sorts by, and the order each sorts in: the
# worst first, routines without a figure last, then by name.
LIST_SORTS = ("failure_rate", "lateness")


def list_figures(since: datetime) -> Subquery:
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
