"""The one validated, frozen model of a routine.

A routine reaches beat through two doors: declared in code (``routine()``,
``register()``, ``beat_schedule``: :func:`define`) and read from a ``routines``
row, possibly typed in by hand (``routine_rows.from_columns``). Both build the
same :class:`Routine`, whose construction checks every limit once, with one set of
messages: ``catch_up_cap=0`` is refused at declaration with the same words
that mark a hand-written row with ``catch_up_cap = 0`` invalid. What differs
between the doors is only how values arrive (Python objects, or JSON text and
column values) and how the schedule is written (a Celery/our schedule object,
or the ``cron``/``interval_seconds`` columns); the schedule's own limits are
the schedule constructors' (:mod:`celery_routines.schedules`), the same for both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.policy.ceilings import Ceiling, one_per_unit
from celery_routines.policy.notify_urls import check_notify_url
from celery_routines.policy.states import CatchUp, Overlap, choices
from celery_routines.schedules.base import NEVER
from celery_routines.schedules.calendar import parse_shift
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.exclusions import Exclusions, exclusion_entries
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.oneoff import OneOffSchedule, parse_at
from celery_routines.schedules.parse import check_one_kind, parse_schedule, parse_specs, schedule_of
from celery_routines.schedules.rrule import RRuleSchedule
from celery_routines.schedules.solar import SolarSchedule
from celery_routines.schedules.zones import load_zone

# The longest routine name; also the width of ``routines.name``.
NAME_MAX_LENGTH = 200
CATCH_UP_CAP_LIMIT = 100_000
MAX_RETRIES_LIMIT = 100
# The longest wait a routine may ask for (max_lateness, retry_base_seconds).
SECONDS_LIMIT = 366 * 86400
PAUSE_AFTER_FAILURES_LIMIT = 1000
# The shortest run_timeout: a heartbeat goes out every third of it.
RUN_TIMEOUT_MIN = 1.0

E = TypeVar("E", CatchUp, Overlap)

OPTION_NAMES = frozenset(
    {
        "name",
        "args",
        "kwargs",
        "timezone",
        "catch_up",
        "catch_up_cap",
        "max_lateness",
        "overlap",
        "max_retries",
        "retry_base_seconds",
        "ceiling",
        "enabled",
        "options",
        "run_timeout",
        "at",
        "starts_at",
        "ends_at",
        "jitter",
        "exclude",  # issue 34: calendars
        "shift",
        "pause_after_failures",
        "notify_url",
    }
)
# The widest jitter: a day (a send instant further from its window is a schedule).
JITTER_LIMIT = 86400


@dataclass(frozen=True)
class Routine:
    """A routine's definition; every field is checked when it is built and
    :class:`InvalidRoutine` names the routine and the first bad value."""

    name: str
    task: str
    cron: str | None
    interval_seconds: float | None
    # None: the configured routines_timezone, resolved when the routine fires.
    timezone: str | None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    catch_up: CatchUp = CatchUp.CATCH_UP
    catch_up_cap: int = 25
    max_lateness: float | None = None
    overlap: Overlap = Overlap.SKIP
    max_retries: int = 4
    retry_base_seconds: float = 60.0
    ceilings: tuple[Ceiling, ...] = ()
    enabled: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)
    # Seconds without a sign of life before a run is lost; None: the
    # configured routines_run_timeout.
    run_timeout: float | None = None
    at: datetime | None = None
    """A one-off's instant (aware UTC); then ``cron``/``interval_seconds`` are None."""
    solar: str | None = None
    """A solar schedule as ``"<event> <lat> <lon>"``."""
    rrule: str | None = None
    """An RFC 5545 rule with a local ``DTSTART``, read in ``timezone``."""
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    jitter: int | None = None
    """Whole seconds; each window goes out ``[0, jitter)`` seconds after it."""
    # Calendars (issue 34): several specs, exclusions, business-day shift.
    schedules: tuple[str | float, ...] | None = None
    exclude: tuple[str, ...] = ()
    shift: str | None = None
    pause_after_failures: int | None = None
    """Pause the routine after this many consecutive final failures."""
    notify_url: str | None = None
    """Where this routine's notifications go; None: ``routines_notify_url``."""
    # Set by from_columns: args, kwargs and options were just read from JSON,
    # so serialising them again to check them would only cost time.
    from_json: InitVar[bool] = False

    def __post_init__(self, from_json: bool) -> None:
        check_name(self.name, self.task)
        try:
            self._check(from_json)
        except ScheduleError as exc:
            raise InvalidRoutine(self.name, str(exc)) from None

    def _check(self, from_json: bool) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        if self.timezone is not None:
            load_zone(self.timezone)
        set_(self, "catch_up", _member(CatchUp, "catch_up", self.catch_up))
        set_(self, "catch_up_cap", _whole("catch_up_cap", self.catch_up_cap, 1, CATCH_UP_CAP_LIMIT))
        set_(self, "max_lateness", _optional_seconds("max_lateness", self.max_lateness))
        set_(self, "overlap", _member(Overlap, "overlap", self.overlap))
        set_(self, "max_retries", _whole("max_retries", self.max_retries, 0, MAX_RETRIES_LIMIT))
        set_(self, "retry_base_seconds", _seconds("retry_base_seconds", self.retry_base_seconds))
        set_(self, "ceilings", _ceilings(self.ceilings))
        set_(self, "run_timeout", _run_timeout(self.run_timeout))
        if self.pause_after_failures is not None:
            limit = PAUSE_AFTER_FAILURES_LIMIT
            count = _whole("pause_after_failures", self.pause_after_failures, 1, limit)
            set_(self, "pause_after_failures", count)
        if self.notify_url is not None:
            check_notify_url(self.notify_url)
        _check_schedule_fields(self)
        _check_calendar(self)
        if not isinstance(self.enabled, bool):
            raise ScheduleError(f"enabled must be True or False, got {self.enabled!r}")
        args, kwargs, options = self.args, self.kwargs, self.options
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise ScheduleError(f"args must be a list or tuple, got {args!r}")
        if not isinstance(kwargs, Mapping):
            raise ScheduleError(f"kwargs must be a dict, got {kwargs!r}")
        if not isinstance(options, Mapping):
            raise ScheduleError(f"options must be a dict of apply_async options, got {options!r}")
        if not from_json:
            for label, value in (("args", list(args)), ("kwargs", kwargs), ("options", options)):
                _require_json(label, value)
        set_(self, "args", tuple(args))

    def columns(self) -> dict[str, Any]:
        """The definition as ``routines`` columns (for the store's upsert)."""
        return {
            "name": self.name,
            "task": self.task,
            "cron": self.cron,
            "interval_seconds": self.interval_seconds,
            "timezone": self.timezone,
            "enabled": self.enabled,
            "args": json.dumps(list(self.args)),
            "kwargs": json.dumps(dict(self.kwargs)),
            "options": json.dumps(dict(self.options)),
            "catch_up": self.catch_up.value,
            "catch_up_cap": self.catch_up_cap,
            "max_lateness": self.max_lateness,
            "overlap": self.overlap.value,
            "max_retries": self.max_retries,
            "retry_base_seconds": self.retry_base_seconds,
            "ceiling": json.dumps([c.as_json() for c in self.ceilings]) if self.ceilings else None,
            "run_timeout": self.run_timeout,
            "at": self.at,
            "solar": self.solar,
            "rrule": self.rrule,
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "jitter_seconds": self.jitter,
            "schedules": json.dumps(list(self.schedules)) if self.schedules else None,
            "exclude": json.dumps(list(self.exclude)) if self.exclude else None,
            "shift": self.shift,
            "pause_after_failures": self.pause_after_failures,
            "notify_url": self.notify_url,
        }


# -- the two doors -----------------------------------------------------------------


def define(task_name: str, schedule: Any, **options: Any) -> Routine:
    """A routine declared in code; every error names the routine and the bad value."""
    name = options.get("name", task_name)
    check_name(name, task_name)
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise InvalidRoutine(
            name,
            f"unknown option(s) {', '.join(sorted(unknown))}; "
            f"known options are {', '.join(sorted(OPTION_NAMES))}",
        )
    timezone = options.get("timezone")
    at = solar_spec = rule = None
    cron = interval = None
    try:
        if timezone is not None:
            load_zone(timezone)
        zone = timezone or "UTC"
        starts_at = _instant_option("starts_at", options.get("starts_at"), timezone)
        ends_at = _instant_option("ends_at", options.get("ends_at"), timezone)
        if options.get("at") is not None:
            # A schedule given as well is refused by the model, like a row with both.
            at = parse_at(options["at"], timezone)
        if isinstance(schedule, list | tuple):
            specs, parsed = tuple(parse_specs(schedule, zone)), None
        else:
            specs = None
            parsed = None if schedule is None and at is not None else parse_schedule(schedule, zone)
    except ScheduleError as exc:
        raise InvalidRoutine(name, str(exc)) from None
    if isinstance(parsed, CronSchedule):
        cron = parsed.expression
        if timezone is None and parsed.timezone != "UTC":
            timezone = parsed.timezone  # a Celery crontab that carries its own zone
    elif isinstance(parsed, IntervalSchedule):
        interval = float(parsed.seconds)
    elif isinstance(parsed, SolarSchedule):
        solar_spec = parsed.spec
    elif isinstance(parsed, RRuleSchedule):
        rule = parsed.rule
    elif isinstance(parsed, OneOffSchedule):
        at = parsed.at  # a one-off schedule object given positionally
    ceiling = options.get("ceiling")
    return Routine(
        name=name,
        task=task_name,
        cron=cron,
        interval_seconds=interval,
        timezone=timezone,
        args=options.get("args", ()),
        kwargs=options.get("kwargs", {}),
        catch_up=options.get("catch_up", CatchUp.CATCH_UP),
        catch_up_cap=options.get("catch_up_cap", 25),
        max_lateness=options.get("max_lateness"),
        overlap=options.get("overlap", Overlap.SKIP),
        max_retries=options.get("max_retries", 4),
        retry_base_seconds=options.get("retry_base_seconds", 60),
        ceilings=() if ceiling is None else ceiling,
        enabled=options.get("enabled", True),
        options=options.get("options", {}),
        run_timeout=options.get("run_timeout"),
        at=at,
        solar=solar_spec,
        rrule=rule,
        starts_at=starts_at,
        ends_at=ends_at,
        jitter=options.get("jitter"),
        schedules=specs,
        exclude=options.get("exclude", ()),
        shift=options.get("shift"),
        pause_after_failures=options.get("pause_after_failures"),
        notify_url=options.get("notify_url"),
    )


# -- the limits ----------------------------------------------------------------------


def check_name(name: Any, task_name: Any) -> None:
    if not isinstance(task_name, str) or not task_name.strip():
        raise InvalidRoutine(str(name), f"task name must be a non-empty string, got {task_name!r}")
    if not isinstance(name, str) or not name.strip():
        raise InvalidRoutine(str(name), f"name must be a non-empty string, got {name!r}")
    if len(name) > NAME_MAX_LENGTH:
        raise InvalidRoutine(
            name[:40] + "...",
            f"name is {len(name)} characters long; at most {NAME_MAX_LENGTH} are allowed",
        )
    if not name.isprintable():
        raise InvalidRoutine(name, "name must not contain control characters or line breaks")


def _check_schedule_fields(routine: Routine) -> None:
    """The limits of the schedule kinds and bounds added to cron and interval,
    the same for both doors (a declaration and a ``routines`` row)."""
    for label in ("at", "starts_at", "ends_at"):
        value = getattr(routine, label)
        if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
            raise ScheduleError(f"{label} must be a timezone-aware datetime, got {value!r}")
    check_one_kind(
        routine.cron,
        routine.interval_seconds,
        routine.at,
        routine.solar,
        routine.rrule,
        routine.schedules,
    )
    if routine.at is not None and routine.at >= NEVER:
        raise ScheduleError(f"at must be before {NEVER.date()}, got {routine.at.isoformat()}")
    starts, ends = routine.starts_at, routine.ends_at
    if starts is not None and ends is not None and ends < starts:
        raise ScheduleError(
            f"ends_at ({ends.isoformat()}) is before starts_at ({starts.isoformat()})"
        )
    if routine.solar is not None:
        SolarSchedule.from_spec(routine.solar)
    if routine.jitter is not None:
        _whole("jitter", routine.jitter, 1, JITTER_LIMIT)


def _check_calendar(routine: Routine) -> None:
    """``schedules``, ``exclude`` and ``shift`` (issue 34), normalised; the
    calendar is built once here so that a bad country, date or combination is
    refused at the door, not at a tick."""
    set_ = object.__setattr__
    if routine.schedules is not None:
        set_(routine, "schedules", tuple(parse_specs(routine.schedules, routine.timezone or "UTC")))
    set_(routine, "exclude", Exclusions(exclusion_entries(routine.exclude)).entries)
    set_(routine, "shift", None if (shift := parse_shift(routine.shift)) is None else shift.value)
    if routine.exclude or routine.shift is not None:
        schedule_of(routine, routine.timezone or "UTC")


def _instant_option(label: str, value: Any, timezone: str | None) -> datetime | None:
    return None if value is None else parse_at(value, timezone, label)


def _member(kind: type[E], label: str, value: Any) -> E:
    member = kind._value2member_map_.get(value) if isinstance(value, str) else None
    if member is None:
        raise ScheduleError(f"{label} must be {choices(kind)}, got {value!r}")
    return member  # type: ignore[return-value]


def _ceilings(value: Any) -> tuple[Ceiling, ...]:
    items = tuple(value) if isinstance(value, list | tuple) else (value,)
    for item in items:
        if not isinstance(item, Ceiling):
            raise ScheduleError(f"ceiling must be a Ceiling(...) or a list of them, got {item!r}")
    one_per_unit(items)
    return items


def _require_json(label: str, value: Any) -> None:
    try:
        # NaN and Infinity are not JSON: a routine holding them could not be
        # shown by the API nor read by another JSON parser.
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{label} must be JSON-serialisable ({exc}), got {value!r}") from None


def _whole(label: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ScheduleError(f"{label} must be a whole number from {low} to {high}, got {value!r}")
    return value


def _seconds(label: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= SECONDS_LIMIT
    ):
        # A number shows the same whether it came as 0 or 0.0 (a REAL column
        # reads back either way), so both doors give the same words.
        shown = f"{value:g}" if isinstance(value, int | float) else repr(value)
        raise ScheduleError(
            f"{label} must be a positive number of seconds (at most a year), got {shown}"
        )
    return float(value)


def _run_timeout(value: Any) -> float | None:
    """A run's heartbeat goes out every third of it, so below a second the
    worker would write to the database several times a second per run."""
    seconds = _optional_seconds("run_timeout", value)
    if seconds is not None and seconds < RUN_TIMEOUT_MIN:
        raise ScheduleError(
            f"run_timeout must be at least {RUN_TIMEOUT_MIN:g} second (a heartbeat goes out "
            f"every third of it), got {seconds:g}"
        )
    return seconds


def _optional_seconds(label: str, value: Any) -> float | None:
    return None if value is None else _seconds(label, value)
