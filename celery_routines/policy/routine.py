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
from collections.abc import Mapping
from dataclasses import InitVar, dataclass
from datetime import datetime
from typing import Any

from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.policy import option_values as values
from celery_routines.policy.ceilings import Ceiling, parse_ceilings
from celery_routines.policy.notify_urls import check_notify_url, shown_notify_url
from celery_routines.policy.options import Stored, declared_options, option
from celery_routines.policy.states import CatchUp, Overlap
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
PAUSE_AFTER_FAILURES_LIMIT = 1000


# The widest jitter: a day (a send instant further from its window is a schedule).
JITTER_LIMIT = 86400


@dataclass(frozen=True)
class Routine:
    """A routine's definition; every field is checked when it is built and
    :class:`InvalidRoutine` names the routine and the first bad value.

    Every field after ``task`` is an option declared with
    :func:`~celery_routines.policy.options.option`: its type, default, check,
    column and wording, read by every door (:data:`OPTIONS`)."""

    name: str
    task: str
    # The schedule's fields (exactly one kind is set): given as the schedule,
    # not as keywords, and taken at the CLI and form as the schedule.
    cron: str | None = option(stored=Stored("string", 255), keyword=None)
    interval_seconds: float | None = option(stored=values.SECONDS, keyword=None)
    # None: the configured routines_timezone, resolved when the routine fires.
    timezone: str | None = option(
        stored=Stored("string", 64),
        check=values.known_zone,
        entry="text",
        flag="--tz",
        label="Zone",
        words="IANA time zone, e.g. Europe/Rome (default: routines_timezone).",
    )
    at: datetime | None = option(None, stored=values.INSTANT, check=values.aware("at"))
    """A one-off's instant (aware UTC); then ``cron``/``interval_seconds`` are None."""
    solar: str | None = option(None, stored=Stored("string", 100), keyword=None)
    """A solar schedule as ``"<event> <lat> <lon>"``."""
    rrule: str | None = option(None, stored=values.TEXT, keyword=None)
    """An RFC 5545 rule with a local ``DTSTART``, read in ``timezone``."""
    starts_at: datetime | None = values.instant_bound_option(
        "starts_at", label="Starts at", words="No window before this time (read in the zone)."
    )
    ends_at: datetime | None = values.instant_bound_option(
        "ends_at",
        label="Ends at",
        words="No window after this time (read in the zone); then it is done.",
    )
    jitter: int | None = option(
        None,
        stored=values.WHOLE,
        column="jitter_seconds",
        check=values.optional(values.whole_from("jitter", 1, JITTER_LIMIT)),
        entry="whole",
        label="Jitter (s)",
        words="Send each window a fixed 0..N-1 seconds after it.",
    )
    """Whole seconds; each window goes out ``[0, jitter)`` seconds after it."""
    # Calendars (issue 34): several specs, exclusions, business-day shift
    # (checked together, with the zone: _check_calendar).
    schedules: tuple[str | float, ...] | None = option(
        None, stored=values.JSON, keyword=None, to_column=values.json_list_or_none
    )
    exclude: tuple[str, ...] = option(
        (),
        stored=values.JSON,
        to_column=values.json_list_or_none,
        from_column=lambda raw: raw or (),
        entry="lines",
        clears=([],),
        shown=values.entries,
        label="Not on",
        words="Not on: a date, a range A..B, a cron, holidays:CC[-SUBDIV] (one a line, or "
        "repeat the flag; empty clears).",
    )
    shift: str | None = option(
        None,
        stored=Stored("string", 32),
        entry="choice",
        choices=("next_business_day", "previous_business_day"),
        clears=("none",),
        label="Shift",
        words="Move a window on a weekend or excluded day instead of dropping it ('none' clears).",
    )
    args: tuple[Any, ...] = option(
        (),
        stored=Stored("json", server_default="'[]'"),
        check=values.positional_args,
        to_column=values.json_text,
        from_column=values.json_from("args", []),
        entry="json",
        label="Args",
        words='Positional arguments, a JSON list: [1, "a"].',
    )
    kwargs: Mapping[str, Any] = values.json_object_option(
        "kwargs",
        wanted="a dict",
        label="Kwargs",
        words='Keyword arguments, a JSON object: {"a": 1}.',
    )
    options: Mapping[str, Any] = values.json_object_option(
        "options",
        wanted="a dict of apply_async options",
        label="Options",
        words='apply_async options, a JSON object: {"queue": "q"}.',
    )
    catch_up: CatchUp = values.choice_option(
        CatchUp.CATCH_UP,
        "catch_up",
        label="Catch-up",
        words="What a recovery does with missed windows.",
    )
    catch_up_cap: int = option(
        25,
        stored=Stored("integer", server_default="25"),
        check=values.whole_from("catch_up_cap", 1, CATCH_UP_CAP_LIMIT),
        entry="whole",
        label="Catch-up cap",
        words="At most this many missed windows sent.",
    )
    max_lateness: float | None = option(
        None,
        stored=values.SECONDS,
        check=lambda value: values.optional_seconds("max_lateness", value),
        entry="duration",
        label="Lateness",
        words="Skip a window sent later than this: 10m, 1h.",
    )
    overlap: Overlap = values.choice_option(
        Overlap.SKIP,
        "overlap",
        label="Overlap",
        words="What a window does while the previous run is open.",
    )
    max_retries: int = option(
        4,
        stored=Stored("integer", server_default="4"),
        check=values.whole_from("max_retries", 0, MAX_RETRIES_LIMIT),
        entry="whole",
        label="Retries",
        words="Retries after a failure (0: none).",
    )
    retry_base_seconds: float = option(
        60.0,
        stored=Stored("seconds", server_default="60"),
        check=lambda value: values.seconds("retry_base_seconds", value),
        entry="number",
        flag="--retry-base",
        label="Retry base (s)",
        words="First retry's delay (s); doubles.",
    )
    ceilings: tuple[Ceiling, ...] = option(
        (),
        stored=values.JSON,
        keyword="ceiling",
        column="ceiling",
        check=lambda v: values.ceilings(v),
        to_column=lambda v: json.dumps([c.as_json() for c in v]) if v else None,
        from_column=lambda raw: parse_ceilings(raw),
        entry="ceilings",
        flag="--ceiling",
        label="Ceiling",
        words="At most LIMIT [UNIT] per PERIOD: 100/day, '2.5 eur/month' (one a line, or "
        "repeat the flag).",
    )
    enabled: bool = option(
        True, stored=Stored("boolean", server_default="true"), check=values.true_or_false
    )
    # Seconds without a sign of life before a run is lost; None: the
    # configured routines_run_timeout.
    run_timeout: float | None = option(
        None,
        stored=values.SECONDS,
        check=lambda v: values.run_timeout(v),
        entry="duration",
        clears=("none",),
        label="Run timeout",
        words="A run with no sign of life for this long is lost: 10m, 2h ('none': "
        "routines_run_timeout).",
    )
    pause_after_failures: int | None = option(
        None,
        stored=values.WHOLE,
        check=values.optional(
            values.whole_from("pause_after_failures", 1, PAUSE_AFTER_FAILURES_LIMIT)
        ),
        entry="whole",
        clears=(0,),
        label="Pause after failures",
        words="Pause the routine after N consecutive final failures (0: never).",
    )
    """Pause the routine after this many consecutive final failures."""
    notify_url: str | None = option(
        None,
        stored=values.TEXT,
        check=values.optional(check_notify_url),
        entry="text",
        clears=("none", ""),
        shown=shown_notify_url,
        secret=True,
        label="Notify URL",
        words="Post this routine's notifications here instead of routines_notify_url "
        "('none' clears).",
    )
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
        for declared in OPTIONS:
            set_(self, declared.name, declared.check(getattr(self, declared.name)))
        _check_schedule_fields(self)
        _check_calendar(self)
        if not from_json:
            for label in ("args", "kwargs", "options"):
                value = getattr(self, label)
                values.require_json(label, list(value) if label == "args" else value)

    def columns(self) -> dict[str, Any]:
        """The definition as ``routines`` columns (for the store's upsert)."""
        return {
            "name": self.name,
            "task": self.task,
            **{o.column_name: o.to_column(getattr(self, o.name)) for o in OPTIONS},
        }


OPTIONS = declared_options(Routine)
"""Every option, declared once (the fields of :class:`Routine`)."""
OPTION_NAMES = frozenset({"name", *(o.keyword_name for o in OPTIONS if o.keyword_name)})
KEYWORDS = {o.keyword_name: o for o in OPTIONS if o.keyword_name}
# The columns holding JSON text (compared and shown parsed).
JSON_COLUMNS = frozenset(o.column_name for o in OPTIONS if o.stored.kind == "json")


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
    given = {
        o.name: options[keyword] if keyword in options else o.new_default()
        for keyword, o in KEYWORDS.items()
    }
    if given["ceilings"] is None:
        given["ceilings"] = ()
    return Routine(
        **{
            **given,
            "name": name,
            "task": task_name,
            "cron": cron,
            "interval_seconds": interval,
            "timezone": timezone,
            "at": at,
            "solar": solar_spec,
            "rrule": rule,
            "starts_at": starts_at,
            "ends_at": ends_at,
            "schedules": specs,
        }
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
    if not task_name.isprintable():
        raise InvalidRoutine(
            name,
            f"task name must not contain control characters or line breaks, got {task_name!r}",
        )


def _check_schedule_fields(routine: Routine) -> None:
    """The limits of the schedule kinds and bounds added to cron and interval,
    the same for both doors (a declaration and a ``routines`` row)."""
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


def _check_calendar(routine: Routine) -> None:
    """``schedules``, ``exclude`` and ``shift``, normalised; the
    calendar is built once here so that a bad country, date or combination is
    refused at the door, not at a tick."""
    set_ = object.__setattr__
    if routine.schedules is not None:
        set_(routine, "schedules", tuple(parse_specs(routine.schedules, routine.timezone or "UTC")))
    set_(routine, "exclude", Exclusions(exclusion_entries(routine.exclude)).entries)
    set_(routine, "shift", None if (shift := parse_shift(routine.shift)) is None else shift.value)
    # An rrule is built too (and kept: schedules are shared), so that a
    # rule that never fires is refused by this model, whichever door built it.
    if routine.exclude or routine.shift is not None or routine.rrule is not None:
        schedule_of(routine, routine.timezone or "UTC")


def _instant_option(label: str, value: Any, timezone: str | None) -> datetime | None:
    return None if value is None else parse_at(value, timezone, label)
