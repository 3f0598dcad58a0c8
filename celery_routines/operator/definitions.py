"""A routine's definition as ``add``/``edit`` pass it to
:func:`celery_routines.policy.routine.define`: the options given on the
command line (or by the API) spelled as ``define`` spells them, the stored
definition read back as options, and the values as a change's history shows
them. Every option is handled as its declaration says
(:data:`celery_routines.policy.routine.OPTIONS`)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.operator.texts import ceiling, duration
from celery_routines.policy.option_values import json_bounds_problem
from celery_routines.policy.options import RoutineOption
from celery_routines.policy.routine import JSON_COLUMNS, OPTIONS
from celery_routines.schedules.oneoff import parse_at
from celery_routines.store import RoutineRecord

# The options add/edit take (by their field names), and the columns of each.
EDITABLE = {o.name: o for o in OPTIONS if o.keyword_name}
BY_COLUMN = {o.column_name: o for o in OPTIONS}


def given_options(**values: Any) -> dict[str, Any]:
    """The options given (not None), as ``define`` spells them, read as the
    CLI and the API take them (``5m``, ``100/day``) and cleared by the
    values that clear (``--shift none``)."""
    options: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        declared = EDITABLE.get(key)
        if declared is None:
            known = ", ".join(EDITABLE)
            raise TypeError(f"unknown routine option {key!r}; the options are {known}")
        options[str(declared.keyword_name)] = entered(declared, value)
    return options


def entered(declared: RoutineOption, value: Any) -> Any:
    if any(value == clear and type(value) is type(clear) for clear in declared.clears):
        return declared.new_default()
    if declared.entry == "duration":
        return duration(value, declared.name).total_seconds()
    if declared.entry == "ceilings":
        return tuple(ceiling(item) for item in value)
    if declared.entry == "lines" and isinstance(value, list | tuple):
        value = [entry for entry in value if entry.strip()]  # `--exclude ''` clears it
        return value or declared.new_default()
    return value


def instants(name: str, zone: str, **values: Any) -> tuple[datetime | None, ...]:
    """``--at``/``--starts-at``/``--ends-at`` as instants: a time without an
    offset is read in ``--tz``, else the routine's (or the configured) zone."""
    try:
        return tuple(
            None if value is None else parse_at(value, zone, label)
            for label, value in values.items()
        )
    except ScheduleError as exc:
        raise InvalidRoutine(name, str(exc)) from None
    except OverflowError:
        shown = ", ".join(f"{label} {value!r}" for label, value in values.items() if value)
        raise InvalidRoutine(name, f"{shown}: out of the calendar's range") from None


def current_options(record: RoutineRecord) -> dict[str, Any]:
    """The stored definition as ``define`` options, those set (a value that
    does not read is passed on as it is, for ``define`` to name, unless the
    edit replaces it)."""
    options: dict[str, Any] = {}
    for declared in EDITABLE.values():
        raw = getattr(record, declared.column_name)
        try:
            value = declared.from_column(raw)
        except ScheduleError:
            value = raw
        if value is not None:
            options[str(declared.keyword_name)] = value
    return options


def loads(raw: str | None, empty: Any) -> Any:
    if not raw:
        return empty
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    # A value over the limits (nested hundreds deep) is compared and shown as
    # its text: reading it further would recurse past Python's limit.
    return raw if json_bounds_problem("value", value) else value


def same_value(key: str, stored: Any, new: Any) -> bool:
    if key in JSON_COLUMNS:
        return loads(stored, None) == loads(new, None)
    return bool(stored == new)


def shown_value(key: str, value: Any) -> Any:
    """A column's value as the history and ``add``/``edit``'s answer show it."""
    if isinstance(value, datetime):
        return value.isoformat()
    if key in JSON_COLUMNS and isinstance(value, str):
        value = loads(value, None)
    declared = BY_COLUMN.get(key)
    return value if declared is None or key in JSON_COLUMNS else declared.shown(value)
