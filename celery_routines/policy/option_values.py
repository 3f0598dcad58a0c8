"""How a routine option's value is checked and written to its column: the
pieces the declarations in :mod:`celery_routines.policy.routine` are made
of. Each check raises ``ScheduleError`` in the user's words (the model adds
the routine's name) and returns the value normalised."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from celery_routines.errors import ScheduleError
from celery_routines.policy.ceilings import Ceiling, one_per_unit
from celery_routines.policy.options import Stored, option
from celery_routines.policy.states import CatchUp, Overlap, choices
from celery_routines.schedules.exclusions import exclusion_entries
from celery_routines.schedules.zones import load_zone

# The longest wait a routine may ask for (max_lateness, retry_base_seconds).
SECONDS_LIMIT = 366 * 86400
# The shortest run_timeout: a heartbeat goes out every third of it.
RUN_TIMEOUT_MIN = 1.0
# The deepest nesting and the largest JSON text of args, kwargs and options:
# a task's arguments need neither more, and a value nested hundreds deep
# breaks every recursive reader (json.dumps, the panel, show --json).
JSON_DEPTH_LIMIT = 32
JSON_BYTES_LIMIT = 64 * 1024

E = TypeVar("E", CatchUp, Overlap)


def optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else check(value)


def whole_from(label: str, low: int, high: int) -> Callable[[Any], int]:
    return lambda value: whole(label, value, low, high)


def json_text(value: Any) -> str:
    return json.dumps(list(value) if isinstance(value, tuple) else dict(value))


def json_list_or_none(value: Any) -> str | None:
    return json.dumps(list(value)) if value else None


def json_from(label: str, empty: Any) -> Callable[[Any], Any]:
    return lambda raw: json_column(label, raw, empty)


def known_zone(value: Any) -> Any:
    if value is not None:
        load_zone(value)
    return value


def true_or_false(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ScheduleError(f"enabled must be True or False, got {value!r}")
    return value


def positional_args(value: Any) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ScheduleError(f"args must be a list or tuple, got {shown_briefly(value)}")
    args = tuple(value)
    bounded("args", args)
    return args


def json_bounds_problem(label: str, value: Any) -> str | None:
    """Why ``value`` (args, kwargs or options) is over the limits, or None:
    nested deeper than JSON_DEPTH_LIMIT, or over JSON_BYTES_LIMIT as JSON.
    Walked without recursion, and only as far as needed to decide."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > JSON_BYTES_LIMIT:  # each value takes at least a byte of JSON
            return f"{label} is too large: more than {JSON_BYTES_LIMIT} bytes of JSON"
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > JSON_DEPTH_LIMIT:
            return f"{label} is nested too deep: more than {JSON_DEPTH_LIMIT} levels"
        stack.extend((child, depth + 1) for child in children)
    try:
        size = len(json.dumps(value, default=repr).encode("utf-8"))
    except (TypeError, ValueError):
        return None  # not JSON: require_json says so
    if size > JSON_BYTES_LIMIT:
        return f"{label} is too large: {size} bytes of JSON, at most {JSON_BYTES_LIMIT}"
    return None


def bounded(label: str, value: Any) -> Any:
    problem = json_bounds_problem(label, value)
    if problem is not None:
        raise ScheduleError(problem)
    return value


def shown_briefly(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters (an error naming a huge
    value stays one readable line)."""
    try:
        text = repr(value)
    except RecursionError:
        return f"a {type(value).__name__} nested too deep to show"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def mapping(label: str, wanted: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ScheduleError(f"{label} must be {wanted}, got {shown_briefly(value)}")
        return value

    return check


def aware(label: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
            raise ScheduleError(f"{label} must be a timezone-aware datetime, got {value!r}")
        return value

    return check


def enum_value(value: Any) -> Any:
    return value.value


def entries(value: Any) -> Any:
    """Exclusions as a list of entries (a hand-written ``a;b`` text too);
    text that does not read is shown as it is."""
    if not value:
        return None
    try:
        return list(exclusion_entries(value))
    except ValueError:
        return [value]


TEXT = Stored("text")
JSON = Stored("json")  # text holding JSON
SECONDS = Stored("seconds")
INSTANT = Stored("instant")
WHOLE = Stored("integer")


def choice_option(default: E, name: str, *, label: str, words: str) -> Any:
    """A Routine field holding one of an enum's values (catch_up, overlap):
    a short text column defaulting to ``default``, offered as a choice."""
    kind = type(default)
    return option(
        default,
        stored=Stored("string", 16, f"'{default.value}'"),
        check=lambda value: member(kind, name, value),
        to_column=enum_value,
        entry="choice",
        choices=tuple(item.value for item in kind),
        label=label,
        words=words,
    )


def json_object_option(name: str, *, wanted: str, label: str, words: str) -> Any:
    """A Routine field holding a JSON object (kwargs, options): ``{}`` by
    default (a new one for each routine), JSON text in its column."""
    return option(
        factory=dict,
        stored=Stored("json", server_default="'{}'"),
        check=lambda value: bounded(name, mapping(name, wanted)(value)),
        to_column=json_text,
        from_column=json_from(name, {}),
        entry="json",
        label=label,
        words=words,
    )


def instant_bound_option(name: str, *, label: str, words: str) -> Any:
    """A Routine field bounding its windows in time (starts_at, ends_at): an
    aware instant or None, entered as an instant."""
    return option(
        None, stored=INSTANT, check=aware(name), entry="instant", label=label, words=words
    )


def member(kind: type[E], label: str, value: Any) -> E:
    member = kind._value2member_map_.get(value) if isinstance(value, str) else None
    if member is None:
        raise ScheduleError(f"{label} must be {choices(kind)}, got {value!r}")
    return member  # type: ignore[return-value]


def ceilings(value: Any) -> tuple[Ceiling, ...]:
    items = tuple(value) if isinstance(value, list | tuple) else (value,)
    for item in items:
        if not isinstance(item, Ceiling):
            raise ScheduleError(f"ceiling must be a Ceiling(...) or a list of them, got {item!r}")
    one_per_unit(items)
    return items


def require_json(label: str, value: Any) -> None:
    try:
        # NaN and Infinity are not JSON: a routine holding them could not be
        # shown by the API nor read by another JSON parser.
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{label} must be JSON-serialisable ({exc}), got {value!r}") from None


def whole(label: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ScheduleError(f"{label} must be a whole number from {low} to {high}, got {value!r}")
    return value


def seconds(label: str, value: Any) -> float:
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


def run_timeout(value: Any) -> float | None:
    """A run's heartbeat goes out every third of it, so below a second the
    worker would write to the database several times a second per run."""
    seconds = optional_seconds("run_timeout", value)
    if seconds is not None and seconds < RUN_TIMEOUT_MIN:
        raise ScheduleError(
            f"run_timeout must be at least {RUN_TIMEOUT_MIN:g} second (a heartbeat goes out "
            f"every third of it), got {seconds:g}"
        )
    return seconds


def optional_seconds(label: str, value: Any) -> float | None:
    return None if value is None else seconds(label, value)


def json_column(label: str, raw: str | None, empty: Any) -> Any:
    """A JSON column's value (``empty`` for NULL or ''), read as JSON is
    written: NaN and Infinity refused."""
    if not raw:
        return empty
    try:
        return json.loads(raw, parse_constant=not_json)
    except RecursionError:
        raise ScheduleError(
            f"{label} is nested too deep: more than {JSON_DEPTH_LIMIT} levels"
        ) from None
    except ValueError as exc:
        raise ScheduleError(f"{label} is not valid JSON ({exc}): {shown_briefly(raw)}") from None


def not_json(constant: str) -> Any:
    """Python's json reads NaN and Infinity; JSON has neither."""
    raise ValueError(f"{constant} is not a JSON number")
