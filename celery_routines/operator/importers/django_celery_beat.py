"""Reading django-celery-beat 2.x's tables, with SQLAlchemy and no Django.

Each ``PeriodicTask`` row becomes a routine, mapped as django-celery-beat's
own scheduler reads it (``django_celery_beat.schedulers.ModelEntry``): the
same crontab fields in the crontab's zone, the same options (queue,
exchange, routing_key, priority, its headers plus ``periodic_task_name``,
``expire_seconds`` as the message's ``expires``), ``start_time`` and
``expires`` as the schedule's bounds, and a ``one_off`` task ending after
its one window. ``last_run_at`` sets the first window (see ``apply``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    Numeric,
    String,
    Table,
    Text,
    TypeDecorator,
    create_engine,
    inspect,
    select,
)
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.types import TypeEngine

from celery_routines.errors import RoutinesError, ScheduleError
from celery_routines.operator.importers.plan import (
    ImportPlan,
    Planned,
    Unmappable,
    behaviour_options,
    behaviour_text,
)
from celery_routines.policy.routine import Routine, define
from celery_routines.schedules.base import first_window
from celery_routines.schedules.interval import whole_second_after, whole_seconds
from celery_routines.schedules.parse import crontab_to_cron, schedule_of
from celery_routines.schedules.solar import SolarSchedule
from celery_routines.schedules.zones import load_zone
from celery_routines.store.engine import MYSQL_DEFAULT_DRIVER, postgres_driver, safe_url

SOURCE = "django-celery-beat"
OWNER = f"import:{SOURCE}"
PREFIX = "django_celery_beat_"
# The crontab's fields, in the order django-celery-beat shows them.
CRONTAB_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
PERIOD_SECONDS = {
    "days": 86400.0,
    "hours": 3600.0,
    "minutes": 60.0,
    "seconds": 1.0,
    "microseconds": 1e-6,
}


class ImportSourceError(RoutinesError, ValueError):
    """The source cannot be read (unreachable, not what it should be)."""


class When(TypeDecorator[Any]):
    """A datetime column as the driver hands it over. PostgreSQL's and
    MySQL's drivers give datetimes; SQLite gives its text, parsed per row by
    ``read`` so that a value that is not a datetime is that task's error,
    not a traceback while fetching every row."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(String() if dialect.name == "sqlite" else DateTime())


_meta = MetaData()
TASKS = Table(
    f"{PREFIX}periodictask",
    _meta,
    Column("id", Integer, primary_key=True),
    Column("name", String),
    Column("task", String),
    Column("args", Text),
    Column("kwargs", Text),
    Column("queue", String),
    Column("exchange", String),
    Column("routing_key", String),
    Column("headers", Text),
    Column("priority", Integer),
    Column("expires", When),
    Column("expire_seconds", Integer),
    Column("one_off", Boolean),
    Column("start_time", When),
    Column("enabled", Boolean),
    Column("last_run_at", When),
    Column("description", Text),
    Column("crontab_id", Integer),
    Column("interval_id", Integer),
    Column("solar_id", Integer),
    Column("clocked_id", Integer),
)
CRONTABS = Table(
    f"{PREFIX}crontabschedule",
    _meta,
    Column("id", Integer, primary_key=True),
    Column("minute", String),
    Column("hour", String),
    Column("day_of_week", String),
    Column("day_of_month", String),
    Column("month_of_year", String),
    Column("timezone", String),
)
INTERVALS = Table(
    f"{PREFIX}intervalschedule",
    _meta,
    Column("id", Integer, primary_key=True),
    Column("every", Integer),
    Column("period", String),
)
SOLARS = Table(
    f"{PREFIX}solarschedule",
    _meta,
    Column("id", Integer, primary_key=True),
    Column("event", String),
    Column("latitude", Numeric(asdecimal=False)),
    Column("longitude", Numeric(asdecimal=False)),
)
CLOCKEDS = Table(
    f"{PREFIX}clockedschedule",
    _meta,
    Column("id", Integer, primary_key=True),
    Column("clocked_time", When),
)


def read(
    url: str,
    *,
    now: datetime,
    naive_zone: str = "UTC",
    catch_up: str = "latest",
    our_defaults: bool = False,
) -> ImportPlan:
    """The import plan of the django-celery-beat database at ``url``.

    ``naive_zone``: the zone of datetimes stored without one (Django with
    ``USE_TZ = False`` stores its ``TIME_ZONE``'s wall time; with ``USE_TZ``
    SQLite and MySQL store UTC without saying so). ``our_defaults``: give
    the routines this package's retries and overlap, not the old scheduler's
    (no retries, overlap).
    """
    zone = load_zone(naive_zone)
    engine = source_engine(url)
    shown = safe_url(url)
    try:
        with engine.connect() as conn:
            present = set(inspect(conn).get_table_names())
            missing = sorted(t.name for t in _meta.sorted_tables if t.name not in present)
            if missing:
                raise ImportSourceError(
                    f"{shown} is not a django-celery-beat database: no table "
                    f"{', '.join(missing)} (run django-celery-beat's migrations there, "
                    "or give the database Django uses)"
                )
            schedules = {
                table.name: {row.id: row for row in conn.execute(select(table))}
                for table in (CRONTABS, INTERVALS, SOLARS, CLOCKEDS)
            }
            rows = list(conn.execute(select(TASKS).order_by(TASKS.c.name)))
    except SQLAlchemyError as exc:
        raise ImportSourceError(f"cannot read {shown}: {_first_line(exc)}") from None
    finally:
        engine.dispose()
    plan = ImportPlan(SOURCE, OWNER, behaviour=behaviour_text(SOURCE, our_defaults))
    aware = _aware_in(zone)
    behaviour = {"catch_up": catch_up, **behaviour_options(our_defaults)}
    for row in rows:
        try:
            plan.routines.append(_planned(row, schedules, aware, now, behaviour))
        except (ScheduleError, ValueError, TypeError) as exc:
            reason = getattr(exc, "problem", None) or str(exc)
            plan.unmappable.append(Unmappable(str(row.name), reason))
    return plan


def source_engine(url: str) -> Engine:
    """An engine reading ``url`` (SQLite opened read-only: a mistyped path
    must not create an empty database)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ImportSourceError(f"{url!r} is not a database URL: {exc}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = parsed.database or ""
        if not path or path == ":memory:" or not os.path.isfile(path):
            raise ImportSourceError(f"no SQLite database file at {path or '(no path)'!r}")
        return create_engine(f"sqlite:///file:{os.path.abspath(path)}?mode=ro&uri=true")
    if backend in ("mysql", "mariadb") and "+" not in parsed.drivername:
        parsed = parsed.set(drivername=f"{backend}+{MYSQL_DEFAULT_DRIVER}")
    elif backend == "postgresql":
        parsed = postgres_driver(parsed)
    elif backend not in ("mysql", "mariadb"):
        raise ImportSourceError(
            f"{safe_url(url)}: {backend!r} databases are not read; django-celery-beat's "
            "tables are read from postgresql://, mysql:// or sqlite:///"
        )
    try:
        return create_engine(parsed)
    except ModuleNotFoundError as exc:
        raise ImportSourceError(
            f"reading {safe_url(url)} needs the driver module {exc.name!r}: install the "
            "postgres or mysql extra of celery-routines"
        ) from None


def _planned(
    row: Any,
    schedules: Mapping[str, Mapping[int, Any]],
    aware: Callable[[datetime | None, str], datetime | None],
    now: datetime,
    behaviour: Mapping[str, Any],
) -> Planned:
    name = str(row.name)
    options: dict[str, Any] = {}
    for key in ("queue", "exchange", "routing_key"):
        if getattr(row, key):
            options[key] = getattr(row, key)
    if row.priority is not None:
        options["priority"] = row.priority
    headers = _json(row.headers, {}, dict, "headers")
    # django-celery-beat adds the task's name to every message it sends.
    options["headers"] = {**headers, "periodic_task_name": name}
    if row.expire_seconds:
        options["expires"] = row.expire_seconds
    schedule, timezone, at = _schedule(row, schedules, aware)
    last_run_at = aware(row.last_run_at, "last_run_at")
    given: dict[str, Any] = {
        "name": name,
        "args": _json(row.args, [], list, "args"),
        "kwargs": _json(row.kwargs, {}, dict, "kwargs"),
        "options": options,
        "enabled": bool(row.enabled),
        "timezone": timezone,
        **behaviour,
        "at": at,
        # An interval's grid is anchored on it: from its whole second.
        "starts_at": _whole(aware(row.start_time, "start_time")),
        "ends_at": aware(row.expires, "expires"),
    }
    given = {k: v for k, v in given.items() if v is not None}
    definition = define(str(row.task), schedule, **given)
    if row.one_off and at is None:
        definition = _one_window(definition, given, schedule, last_run_at, now)
    return Planned(definition, last_run_at, row.description or None)


def _schedule(
    row: Any,
    schedules: Mapping[str, Mapping[int, Any]],
    aware: Callable[[datetime | None, str], datetime | None],
) -> tuple[str | timedelta | SolarSchedule | None, str | None, datetime | None]:
    """(the schedule, its zone, a one-off's instant) of a task row."""
    kinds = [k for k in ("crontab", "interval", "solar", "clocked") if getattr(row, f"{k}_id")]
    if len(kinds) != 1:
        raise ScheduleError(
            f"has {', '.join(kinds) if kinds else 'no schedule'}: "
            "django-celery-beat needs exactly one of crontab, interval, solar or clocked"
        )
    kind = kinds[0]
    found = schedules[f"{PREFIX}{kind}schedule"].get(getattr(row, f"{kind}_id"))
    if found is None:
        raise ScheduleError(f"its {kind} schedule (id {getattr(row, f'{kind}_id')}) is missing")
    if kind == "crontab":
        from celery.schedules import crontab

        fields = {key: found._mapping[key] for key in CRONTAB_FIELDS}
        try:
            celery_crontab = crontab(**fields)
        except Exception as exc:  # Celery raises ValueError and its own ParseException
            text = _crontab_text(fields)
            raise ScheduleError(f"its crontab {text} does not read: {exc}") from None
        zone = str(found.timezone or "UTC")
        try:
            load_zone(zone)
        except ScheduleError as exc:
            raise ScheduleError(f"its crontab's timezone: {exc}") from None
        return crontab_to_cron(celery_crontab), zone, None
    if kind == "interval":
        seconds = PERIOD_SECONDS.get(found.period)
        if seconds is None:
            raise ScheduleError(f"its interval period {found.period!r} is unknown")
        return timedelta(seconds=whole_seconds(found.every * seconds)), None, None
    if kind == "solar":
        return SolarSchedule(found.event, found.latitude, found.longitude), None, None
    return None, None, aware(found.clocked_time, "clocked_time")


def _whole(instant: datetime | None) -> datetime | None:
    return None if instant is None else whole_second_after(instant)


def _crontab_text(fields: Mapping[str, object]) -> str:
    """A crontab row's fields as django-celery-beat's admin names them."""
    return "(" + ", ".join(f"{key} {value!r}" for key, value in fields.items()) + ")"


def _one_window(
    definition: Routine,
    given: dict[str, Any],
    schedule: str | timedelta | SolarSchedule | None,
    last_run_at: datetime | None,
    now: datetime,
) -> Routine:
    """A ``one_off`` task on a repeating schedule fires its next window only:
    the schedule ends there (django-celery-beat disables it after one run)."""
    zone = definition.timezone or "UTC"
    bounded = schedule_of(definition, zone)
    window = bounded.next_after(last_run_at) if last_run_at else first_window(bounded, now)
    ends_at = min(window, definition.ends_at) if definition.ends_at else window
    if last_run_at is not None:
        ends_at = min(ends_at, last_run_at)  # it ran: done
    if definition.starts_at is not None and ends_at < definition.starts_at:
        ends_at = definition.starts_at
    return define(definition.task, schedule, **{**given, "ends_at": ends_at})


def _json(raw: str | None, empty: Any, kind: type, label: str) -> Any:
    if raw is None or raw == "":
        return empty
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ScheduleError(f"its {label} are not JSON ({exc}): {raw!r}") from None
    if not isinstance(value, kind):
        raise ScheduleError(f"its {label} must be a JSON {kind.__name__}, got {raw!r}")
    return value


def _aware_in(zone: tzinfo) -> Callable[[datetime | None, str], datetime | None]:
    def aware(value: datetime | None, column: str) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # SQLite's text (see When)
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                raise ScheduleError(f"its {column} is not a date and time: {value!r}") from None
        if value.tzinfo is None:
            value = value.replace(tzinfo=zone)
        return value.astimezone(UTC)

    return aware


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
