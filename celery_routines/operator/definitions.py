"""A routine's definition as ``add``/``edit`` pass it to
:func:`celery_routines.policy.routine.define`: the options given on the
command line (or by the API) spelled as ``define`` spells them, the stored
definition read back as options, and the values as a change's history shows
them."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.operator.texts import ceiling, duration
from celery_routines.policy.notify_urls import shown_notify_url
from celery_routines.schedules.exclusions import exclusion_entries
from celery_routines.schedules.oneoff import parse_at
from celery_routines.store import RoutineRecord

# Schedule bounds and jitter: define() options and the columns holding them.
BOUND_OPTIONS = (("starts_at", "starts_at"), ("ends_at", "ends_at"), ("jitter", "jitter_seconds"))
JSON_FIELDS = ("args", "kwargs", "options", "ceiling", "schedules", "exclude")


def given_options(**values: Any) -> dict[str, Any]:
    """The options given (not None), as ``define`` spells them."""
    options: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        if key == "max_lateness":
            value = duration(value, "max_lateness").total_seconds()
        if key == "ceilings":
            key, value = "ceiling", tuple(ceiling(item) for item in value)
        if key in ("args",) and isinstance(value, list):
            value = tuple(value)
        if key == "shift" and value == "none":
            value = None  # `--shift none` clears it
        if key == "exclude":
            value = [entry for entry in value if entry.strip()]  # `--exclude ''` clears it
        if key == "pause_after_failures" and value == 0:
            value = None  # `--pause-after-failures 0`: never pause
        if key == "notify_url" and value in ("", "none"):
            value = None  # `--notify-url none`: routines_notify_url again
        options[key] = value
    return options


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
    """The stored definition as ``define`` options (a value that does not read
    is passed on as it is, for ``define`` to name, unless the edit replaces it)."""
    from celery_routines.policy.ceilings import parse_ceilings

    try:
        ceilings: Any = parse_ceilings(record.ceiling)
    except ScheduleError:
        ceilings = record.ceiling
    return {
        "timezone": record.timezone,
        "args": loads(record.args, []),
        "kwargs": loads(record.kwargs, {}),
        "options": loads(record.options, {}),
        "catch_up": record.catch_up,
        "catch_up_cap": record.catch_up_cap,
        "max_lateness": record.max_lateness,
        "overlap": record.overlap,
        "max_retries": record.max_retries,
        "retry_base_seconds": record.retry_base_seconds,
        "ceiling": ceilings,
        "enabled": record.enabled,
        **({"at": record.at} if record.at is not None else {}),
        "exclude": stored_exclusions(record.exclude),
        "shift": record.shift,
        "pause_after_failures": record.pause_after_failures,
        "notify_url": record.notify_url,
        **{
            option: getattr(record, column)
            for option, column in BOUND_OPTIONS
            if getattr(record, column) is not None
        },
    }


def stored_exclusions(raw: str | None) -> Any:
    try:
        return list(exclusion_entries(raw))
    except ScheduleError:
        return raw  # for define to name, unless the edit replaces it


def loads(raw: str | None, empty: Any) -> Any:
    if not raw:
        return empty
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def same_value(key: str, stored: Any, new: Any) -> bool:
    if key in JSON_FIELDS:
        return loads(stored, None) == loads(new, None)
    return bool(stored == new)


def shown_value(key: str, value: Any) -> Any:
    if key == "notify_url":
        return shown_notify_url(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return loads(value, None) if key in JSON_FIELDS and isinstance(value, str) else value
