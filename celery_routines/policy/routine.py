"""The frozen, validated definition of a routine, built from code declarations."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.policy.catch_up import POLICIES as CATCH_UP_POLICIES
from celery_routines.policy.ceilings import Ceiling
from celery_routines.policy.runs import check_overlap
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.parse import parse_schedule
from celery_routines.schedules.zones import load_zone

# The longest routine name; also the width of ``routines.name``.
NAME_MAX_LENGTH = 200
MAX_RETRIES_LIMIT = 100
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
    }
)


@dataclass(frozen=True)
class RoutineDefinition:
    name: str
    task: str
    cron: str | None
    interval_seconds: float | None
    # None: the configured routines_timezone, resolved when the routine fires.
    timezone: str | None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    catch_up: str = "catch_up"
    catch_up_cap: int = 25
    max_lateness: float | None = None
    overlap: str = "skip"
    max_retries: int = 4
    retry_base_seconds: float = 60.0
    ceilings: tuple[Ceiling, ...] = ()
    enabled: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)

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
            "catch_up": self.catch_up,
            "catch_up_cap": self.catch_up_cap,
            "max_lateness": self.max_lateness,
            "overlap": self.overlap,
            "max_retries": self.max_retries,
            "retry_base_seconds": self.retry_base_seconds,
            "ceiling": json.dumps([c.as_json() for c in self.ceilings]) if self.ceilings else None,
        }


def define(task_name: str, schedule: Any, **options: Any) -> RoutineDefinition:
    """Validate a declaration; every error names the routine and the bad value."""
    name = options.get("name", task_name)
    _check_name(name, task_name)
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise InvalidRoutine(
            name,
            f"unknown option(s) {', '.join(sorted(unknown))}; "
            f"known options are {', '.join(sorted(OPTION_NAMES))}",
        )
    try:
        return _define(name, task_name, schedule, options)
    except ScheduleError as exc:
        raise InvalidRoutine(name, str(exc)) from None


def _check_name(name: Any, task_name: Any) -> None:
    if not isinstance(task_name, str) or not task_name.strip():
        raise InvalidRoutine(str(name), f"task name must be a non-empty string, got {task_name!r}")
    if not isinstance(name, str) or not name.strip():
        raise InvalidRoutine(str(name), f"name must be a non-empty string, got {name!r}")
    if len(name) > NAME_MAX_LENGTH:
        raise InvalidRoutine(
            name[:40] + "...",
            f"name is {len(name)} characters long; at most {NAME_MAX_LENGTH} are allowed",
        )
    if any((ch.isspace() and ch != " ") or ord(ch) < 32 for ch in name):
        raise InvalidRoutine(name, "name must not contain control characters or line breaks")


def _define(name: str, task_name: str, schedule: Any, options: dict[str, Any]) -> RoutineDefinition:
    timezone = options.get("timezone")
    if timezone is not None:
        load_zone(timezone)
    parsed = parse_schedule(schedule, timezone or "UTC")
    if isinstance(parsed, CronSchedule):
        cron, interval = parsed.expression, None
        if timezone is None and parsed.timezone != "UTC":
            timezone = parsed.timezone  # a Celery crontab that carries its own zone
    elif isinstance(parsed, IntervalSchedule):
        cron, interval = None, float(parsed.seconds)
    else:  # pragma: no cover - parse_schedule returns only these two
        raise ScheduleError(f"unsupported schedule {schedule!r}")

    catch_up = options.get("catch_up", "catch_up")
    if catch_up not in CATCH_UP_POLICIES:
        raise ScheduleError(
            f"catch_up {catch_up!r} is unknown; use one of {', '.join(CATCH_UP_POLICIES)}"
        )
    overlap = options.get("overlap", "skip")
    check_overlap(overlap)
    ceiling = options.get("ceiling")
    ceilings = _ceilings(ceiling)
    args = options.get("args", ())
    kwargs = options.get("kwargs", {})
    task_options = options.get("options", {})
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise ScheduleError(f"args must be a list or tuple, got {args!r}")
    if not isinstance(kwargs, Mapping):
        raise ScheduleError(f"kwargs must be a dict, got {kwargs!r}")
    if not isinstance(task_options, Mapping):
        raise ScheduleError(f"options must be a dict of apply_async options, got {task_options!r}")
    for label, value in (("args", list(args)), ("kwargs", kwargs), ("options", task_options)):
        _require_json(label, value)
    enabled = options.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ScheduleError(f"enabled must be True or False, got {enabled!r}")
    return RoutineDefinition(
        name=name,
        task=task_name,
        cron=cron,
        interval_seconds=interval,
        timezone=timezone,
        args=tuple(args),
        kwargs=dict(kwargs),
        catch_up=catch_up,
        catch_up_cap=_whole("catch_up_cap", options.get("catch_up_cap", 25), 0, 100_000),
        max_lateness=_optional_seconds("max_lateness", options.get("max_lateness")),
        overlap=overlap,
        max_retries=_whole("max_retries", options.get("max_retries", 4), 0, MAX_RETRIES_LIMIT),
        retry_base_seconds=_seconds("retry_base_seconds", options.get("retry_base_seconds", 60)),
        ceilings=ceilings,
        enabled=enabled,
        options=dict(task_options),
    )


def _ceilings(value: Any) -> tuple[Ceiling, ...]:
    if value is None:
        return ()
    items = tuple(value) if isinstance(value, list | tuple) else (value,)
    for item in items:
        if not isinstance(item, Ceiling):
            raise ScheduleError(f"ceiling must be a Ceiling(...) or a list of them, got {item!r}")
    units = [c.unit for c in items]
    if len(units) != len(set(units)):
        raise ScheduleError(f"at most one ceiling per unit, got units {units!r}")
    return items


def _require_json(label: str, value: Any) -> None:
    try:
        json.dumps(value)
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
        or value <= 0
        or value > 366 * 86400
    ):
        raise ScheduleError(f"{label} must be a positive number of seconds, got {value!r}")
    return float(value)


def _optional_seconds(label: str, value: Any) -> float | None:
    return None if value is None else _seconds(label, value)
