"""The routine a ``routines`` row describes: the second door to the one
validated model (:mod:`celery_routines.policy.routine`), for rows read by beat,
the sweeps and the operator's sends, JSON columns included."""

from __future__ import annotations

import json
from operator import attrgetter
from typing import Any

from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.policy.ceilings import parse_ceilings
from celery_routines.policy.routine import Routine, check_name

# The columns a Routine is built from, besides ``name``; a row's values of
# these (and their types) key the cache below.
SHARED_COLUMNS = (
    "task",
    "cron",
    "interval_seconds",
    "timezone",
    "args",
    "kwargs",
    "options",
    "ceiling",
    "catch_up",
    "catch_up_cap",
    "max_lateness",
    "overlap",
    "max_retries",
    "retry_base_seconds",
    "enabled",
    "run_timeout",
)
OPTIONAL_COLUMNS = (
    "at", "solar", "rrule", "starts_at", "ends_at", "jitter_seconds", "pause_after_failures",
    "notify_url",
)  # fmt: skip
CALENDAR_COLUMNS = ("schedules", "exclude", "shift")  # issue 34
# Distinct definitions (all columns but the name) kept validated; bounded, so
# a million routines that all differ cost a miss each, never memory.
VALIDATED_CACHE_SIZE = 1024
_validated: dict[tuple[Any, ...], Routine] = {}
_every_column = attrgetter(*SHARED_COLUMNS, *OPTIONAL_COLUMNS, *CALENDAR_COLUMNS)


def from_columns(row: Any) -> Routine:
    """The routine a ``routines`` row describes (a ``RoutineRecord`` or any
    object with the columns as attributes). Raises :class:`InvalidRoutine`
    with the message a declaration with the same values would get; only the
    JSON columns have errors of their own (text that is not JSON).

    A tick builds one per claimed row, and a burst's thousands of rows differ
    mostly in their name: a definition validated once (same values of the
    same types in every other column) is copied with the row's name, which
    is all that is checked again. Its ``args``, ``kwargs`` and ``options``
    are then shared by those routines, like any frozen model's values:
    readers copy before changing them (``sending.sender.outgoing_run``).
    """
    try:
        values = _every_column(row)
    except AttributeError:  # a row without the newer, optional columns
        values = tuple(getattr(row, column) for column in SHARED_COLUMNS) + tuple(
            getattr(row, column, None) for column in (*OPTIONAL_COLUMNS, *CALENDAR_COLUMNS)
        )
    key = (values, tuple(map(type, values)))
    template = _validated.get(key)
    if template is None:
        routine = _from_columns(row)
        if len(_validated) >= VALIDATED_CACHE_SIZE:
            _validated.clear()
        _validated[key] = routine
        return routine
    check_name(row.name, template.task)
    routine = object.__new__(Routine)
    routine.__dict__.update(template.__dict__)
    routine.__dict__["name"] = row.name
    return routine


def _from_columns(row: Any) -> Routine:
    try:
        args = _json_column("args", row.args, [])
        kwargs = _json_column("kwargs", row.kwargs, {})
        options = _json_column("options", row.options, {})
        ceilings = parse_ceilings(row.ceiling)
    except ScheduleError as exc:
        raise InvalidRoutine(row.name, str(exc)) from None
    return Routine(
        name=row.name,
        task=row.task,
        cron=row.cron,
        interval_seconds=row.interval_seconds,
        timezone=row.timezone,
        args=args,
        kwargs=kwargs,
        catch_up=row.catch_up,
        catch_up_cap=row.catch_up_cap,
        max_lateness=row.max_lateness,
        overlap=row.overlap,
        max_retries=row.max_retries,
        retry_base_seconds=row.retry_base_seconds,
        ceilings=ceilings,
        enabled=row.enabled,
        options=options,
        run_timeout=row.run_timeout,
        at=getattr(row, "at", None),
        solar=getattr(row, "solar", None),
        rrule=getattr(row, "rrule", None),
        starts_at=getattr(row, "starts_at", None),
        ends_at=getattr(row, "ends_at", None),
        jitter=getattr(row, "jitter_seconds", None),
        schedules=getattr(row, "schedules", None),
        exclude=getattr(row, "exclude", None) or (),
        shift=getattr(row, "shift", None),
        pause_after_failures=getattr(row, "pause_after_failures", None),
        notify_url=getattr(row, "notify_url", None),
        from_json=True,
    )


def _json_column(label: str, raw: str | None, empty: Any) -> Any:
    if not raw:
        return empty
    try:
        return json.loads(raw, parse_constant=_not_json)
    except ValueError as exc:
        raise ScheduleError(f"{label} is not valid JSON ({exc}): {raw!r}") from None


def _not_json(constant: str) -> Any:
    """Python's json reads NaN and Infinity; JSON has neither."""
    raise ValueError(f"{constant} is not a JSON number")
