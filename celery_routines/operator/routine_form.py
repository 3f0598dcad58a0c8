"""A routine's definition as the panel's form and the HTTP API spell it.

The fields are declared once (:data:`FIELDS`: name, label, kind, help); the
form is rendered from that declaration, and the API's JSON bodies use the
same names the API already returns (``GET /api/routines/{name}``'s
``definition``). Values are turned into the options of
:meth:`celery_routines.operator.manage.Managing.add`/``edit`` and checked
through :func:`celery_routines.operator.manage.new_definition`, so every
message is the CLI's. No I/O here: the web layer reads and stores.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_routines.errors import RoutinesError, ScheduleError
from celery_routines.operator.manage import new_definition
from celery_routines.policy.ceilings import parse_ceilings
from celery_routines.policy.option_values import JSON_DEPTH_LIMIT, not_json, shown_briefly
from celery_routines.policy.options import RoutineOption
from celery_routines.policy.routine import OPTIONS

# A stand-in task, and a schedule when the routine's own does not read, to
# check one field on its own.
PLACEHOLDER_TASK = "form.check"
PLACEHOLDER_CRON = "0 9 * * *"


@dataclass(frozen=True)
class FormField:
    name: str
    """The API's name for it, and the form input's."""
    label: str
    kind: str
    """text, multiline, lines (one value a line), json, whole (a whole number), number,
    duration, instant or choice."""
    help: str
    choices: tuple[str, ...] = ()
    option: str | None = None
    """The ``add``/``edit`` option it feeds, when not spelled as ``name``."""

    @property
    def to(self) -> str:
        return self.option or self.name


SCHEDULE = "cron", "interval_seconds", "at", "solar", "rrule"
# Name, task and the schedule are the form's own; every other field is an
# option's, as declared (label, wording, how it is typed).
OWN_FIELDS: tuple[FormField, ...] = (
    FormField("name", "Name", "text", "Unique; shown in lists, keys and the history."),
    FormField("task", "Task", "text", "The Celery task's name, e.g. proj.tasks.report."),
    FormField(
        "cron", "Cron", "lines",
        "5-field cron expression read in the zone, e.g. 30 2 * * 1-5; one a line fire on "
        "their union. Give exactly one kind of schedule.",
    ),
    FormField(
        "interval_seconds", "Every", "duration",
        "An interval: 30s, 5m, 1h30m, 1d, or seconds.", option="every",
    ),
    FormField("at", "Once at", "instant", "A one-off: 2026-12-24T18:00, read in the zone."),
    FormField(
        "solar", "Solar event", "text",
        "'<event> <latitude> <longitude>', e.g. sunrise 45.46 9.19.",
    ),
    FormField(
        "rrule", "Recurrence rule", "multiline",
        "RFC 5545 with its start: DTSTART:20260105T090000 on one line, "
        "RRULE:FREQ=WEEKLY;BYDAY=MO on the next.",
    ),
)  # fmt: skip


def option_field(declared: RoutineOption) -> FormField:
    name = str(declared.keyword_name)
    return FormField(
        name,
        declared.label,
        "lines" if declared.entry == "ceilings" else str(declared.entry),
        declared.words,
        ("", *declared.choices) if declared.choices else (),
        option=None if declared.name == name else declared.name,
    )


FIELDS: tuple[FormField, ...] = (
    *OWN_FIELDS,
    *(option_field(o) for o in OPTIONS if o.entry is not None and o.keyword_name),
)
BY_NAME = {field.name: field for field in FIELDS}
# Fields whose stored value is shown masked (a notify_url's token): the form
# never holds that value, an input left empty keeps the stored one, and the
# masked value sent back is taken as "unchanged", never written.
SECRET_FIELDS = frozenset(str(o.keyword_name) for o in OPTIONS if o.secret and o.keyword_name)
# Values that clear an option, as `celery routines edit` spells them.
CLEARS: dict[str, Any] = {
    str(o.keyword_name): o.clears[0] for o in OPTIONS if o.clears and o.keyword_name
}


# What a definition's checks raise for a bad value (OverflowError: a value
# past datetime's or C's range).
REFUSALS = (RoutinesError, ValueError, OverflowError)


class FieldErrors(RoutinesError, ValueError):
    """Bad values, each named by its field (the API answers 422)."""

    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields
        super().__init__("; ".join(fields.values()))


# -- reading -----------------------------------------------------------------------


def from_json(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """An API body as (values by field, errors by field): unknown fields and
    values of the wrong type are named; JSON ``null`` is kept (it clears)."""
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for key, value in data.items():
        field = BY_NAME.get(key)
        if field is None:
            errors[key] = f"unknown field {key!r}; the fields are {', '.join(BY_NAME)}"
            continue
        problem = _type_problem(field, value)
        if problem:
            errors[key] = f"{key} {problem}, got {value!r}"
        else:
            values[key] = value
    return values, errors


def from_form(form: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A posted form (text) as the API's values; an empty input is absent."""
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for field in FIELDS:
        text = (form.get(field.name) or "").strip()
        if not text:
            continue
        try:
            values[field.name] = _typed(field, text)
        except ValueError as exc:
            errors[field.name] = str(exc)
    return values, errors


def _typed(field: FormField, text: str) -> Any:
    if field.kind == "lines":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[0] if field.name == "cron" and len(lines) == 1 else lines
    if field.kind == "multiline":
        return "\n".join(line.strip() for line in text.splitlines() if line.strip())
    if field.kind == "json":
        try:
            return json.loads(text, parse_constant=not_json)
        except RecursionError:
            raise ValueError(
                f"{field.name} is nested too deep: more than {JSON_DEPTH_LIMIT} levels"
            ) from None
        except ValueError as exc:
            raise ValueError(
                f"--{field.name} must be JSON ({exc}), got {shown_briefly(text)}"
            ) from None
    if field.kind == "whole":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{field.name} must be a whole number, got {text!r}") from None
    if field.kind == "number":
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{field.name} must be a number, got {text!r}") from None
        return int(number) if number.is_integer() else number
    return text


def _type_problem(field: FormField, value: Any) -> str | None:
    if value is None:
        return None if field.name not in ("name", "task") else "must be given"
    kind = field.kind
    if field.name == "args":
        return None if isinstance(value, list) else "must be a JSON list"
    if field.name in ("kwargs", "options"):
        return None if isinstance(value, dict) else "must be a JSON object"
    if kind == "whole" and (isinstance(value, bool) or not isinstance(value, int)):
        return "must be a whole number"
    if kind in ("number", "duration") and (
        isinstance(value, bool)
        or not isinstance(value, int | float | str)
        or (isinstance(value, float) and not math.isfinite(value))
        or (kind == "number" and isinstance(value, str))
    ):
        return "must be a number" + (" of seconds or a duration such as 5m" * (kind == "duration"))
    if field.name == "ceiling":
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(item, str | dict) for item in items):
            return 'must be "100/day", a list of them, or {"limit", "per", "unit"} objects'
        return None
    if kind == "lines" and isinstance(value, list):
        return None if all(isinstance(item, str) for item in value) else "must be texts"
    if kind in ("text", "multiline", "lines", "instant", "choice") and not isinstance(value, str):
        return "must be a text"
    return None


# -- into add/edit's options -------------------------------------------------------


def options_of(values: Mapping[str, Any]) -> dict[str, Any]:
    """``add``/``edit`` keyword arguments from the API's values (without name
    and task); ``null`` becomes the value that clears, where one does."""
    options: dict[str, Any] = {}
    for key, value in values.items():
        if key in ("name", "task"):
            continue
        field = BY_NAME[key]
        if value is None:
            if key not in CLEARS:
                raise FieldErrors({key: f"{key} cannot be cleared here; give a value"})
            value = CLEARS[key]
        if key == "ceiling":
            value = _ceilings(value)
        if key == "exclude" and isinstance(value, str):
            value = [value]
        options[field.to] = value
    return options


def _ceilings(value: Any) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    texts = [item for item in items if isinstance(item, str)]
    objects = [item for item in items if isinstance(item, dict)]
    try:
        return [*texts, *parse_ceilings(json.dumps(objects))] if objects else texts
    except ScheduleError as exc:
        raise FieldErrors({"ceiling": str(exc)}) from None


# -- checking ----------------------------------------------------------------------


def check(values: Mapping[str, Any], default_zone: str) -> Any:
    """The definition ``values`` make, through ``add``'s own checks: the
    whole definition decides, as at every other door; when it is refused,
    every bad field is named (:class:`FieldErrors`)."""
    name = values.get("name") or ""
    task = values.get("task") or PLACEHOLDER_TASK
    options = options_of(values)
    try:
        return new_definition(name, task, default_zone, **options)
    except REFUSALS as exc:
        raise refusal(exc, values, default_zone, name=name) from None


def refusal(
    exc: Exception,
    values: Mapping[str, Any],
    default_zone: str,
    *,
    name: str,
    stored: Mapping[str, Any] | None = None,
) -> FieldErrors:
    """Why a whole definition (a create's, or an edit's with ``stored``) was
    refused, by field: each field that is bad on its own, else the fields
    the combined message names (else the schedule's)."""
    if isinstance(exc, FieldErrors):
        return exc
    errors = field_errors(values, default_zone, name=name, stored=stored)
    return FieldErrors(errors or dict.fromkeys(blamed(str(exc), values), str(exc)))


def field_errors(
    values: Mapping[str, Any],
    default_zone: str,
    *,
    name: str,
    stored: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Each given field checked on its own (with the zone, when it is good),
    in the CLI's words. An option is checked with the routine's own schedule
    (given, else ``stored``), as the whole definition checks it: against a
    stand-in of another kind a good value can read as bad (a shift moves a
    cron's windows; an interval has no days to move)."""
    errors: dict[str, str] = {}
    shown = name or "new"
    order = ("name", "timezone", "task", *(k for k in values if k not in ("name", "timezone")))
    own = _own_schedule(values, stored or {}, default_zone)
    for key in dict.fromkeys(order):
        if key not in values:
            continue
        if key == "name" and not values[key]:
            continue  # a create says it is missing; an edit keeps its name
        task = values["task"] if key == "task" else PLACEHOLDER_TASK
        zone = values.get("timezone") if "timezone" not in errors else None
        given = {"timezone": zone} if zone and key not in ("name", "timezone") else {}
        try:
            option = options_of({key: values[key]})
            schedule = {} if key in SCHEDULE else own
            new_definition(shown, task or "", default_zone, **schedule, **given, **option)
        except FieldErrors as exc:
            errors.update(exc.fields)
        except REFUSALS as exc:
            errors[key] = str(exc)
        if key == "name" and "name" in errors:
            shown = "new"  # the other fields are checked under a name that reads
    return errors


def _own_schedule(
    values: Mapping[str, Any], stored: Mapping[str, Any], default_zone: str
) -> dict[str, Any]:
    """The routine's schedule as ``add``'s options (the one given, else the
    stored one) when it reads on its own; else a stand-in cron (one has
    windows on days, so no option is refused for want of them)."""
    source = values if any(values.get(key) is not None for key in SCHEDULE) else stored
    schedule = {key: source[key] for key in SCHEDULE if source.get(key) is not None}
    if schedule:
        try:
            options = options_of(schedule)
            zone = values.get("timezone") or stored.get("timezone") or default_zone
            new_definition("new", PLACEHOLDER_TASK, str(zone), **options)
        except REFUSALS:
            pass
        else:
            return options
    return {"cron": PLACEHOLDER_CRON}


def blamed(message: str, values: Mapping[str, Any]) -> list[str]:
    """The fields a combined message names (API or CLI spelling), else the
    first schedule field given (else ``cron``)."""
    named = [
        field.name
        for field in FIELDS
        if field.name in values
        and any(
            spelling in message
            for spelling in (field.name, "--" + field.to.replace("_", "-"), "--" + field.name)
        )
    ]
    return named or [next((key for key in SCHEDULE if key in values), "cron")]


def check_new(values: Mapping[str, Any], default_zone: str) -> Any:
    """A create: name and task are required, then :func:`check`."""
    missing = {
        key: f"{key} must be given (a routine needs a {key})"
        for key in ("name", "task")
        if not values.get(key)
    }
    if missing:  # the other fields each on their own: together needs both
        name = values.get("name") or ""
        raise FieldErrors({**field_errors(values, default_zone, name=name), **missing})
    return check(values, default_zone)


# -- a stored routine, back into the form ---------------------------------------------


def stored_values(task: str, definition: Mapping[str, Any]) -> dict[str, Any]:
    """The API's values of a stored definition (``show``'s ``definition``),
    as the form shows them; a union of schedules shows its crons a line."""
    values: dict[str, Any] = {"task": task}
    for field in FIELDS[2:]:
        value = definition.get(field.name)
        if field.name == "cron" and definition.get("schedules"):
            value = [str(spec) for spec in definition["schedules"]]
        if field.name == "ceiling" and value:
            items = value if isinstance(value, list) else [value]
            value = [_ceiling_text(item) for item in items]
        if value is not None and value != "":
            values[field.name] = value
    return values


def _ceiling_text(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    unit = item.get("unit") or "fires"
    limit = f"{item.get('limit', '')}".removesuffix(".0")
    return f"{limit}{'' if unit == 'fires' else ' ' + unit}/{item.get('per', 'day')}"


def form_text(field: FormField, value: Any) -> str:
    """How a value reads in its input."""
    if value is None:
        return ""
    if field.kind == "lines":
        return "\n".join(value) if isinstance(value, list) else str(value)
    if field.kind == "json":
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def hide_secrets(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(``values`` without the secret fields, their masked values by field):
    what the form shows of a stored routine. A masked value in an input
    would be posted back and stored in place of the secret."""
    kept = {key: str(values[key]) for key in SECRET_FIELDS if values.get(key)}
    return {k: v for k, v in values.items() if k not in SECRET_FIELDS}, kept


def without_masked(stored: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` without a secret field that repeats its stored, masked value
    (a client that read the routine and sends it back unchanged)."""
    return {
        key: value
        for key, value in new.items()
        if not (key in SECRET_FIELDS and value is not None and value == stored.get(key))
    }


def edit_options(stored: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The values an edit passes from a whole posted form: every value given
    (``edit`` records only what differs), and ``None`` for an input emptied
    that held a value (it clears, where a value clears). A schedule replaced
    by another kind is not cleared: the new one replaces it. A secret field
    is never shown in its input, so one left empty keeps the stored value
    (typing the clearing word clears it)."""
    given = without_masked(stored, new)
    values = {key: value for key, value in given.items() if key not in ("name", "task")}
    for key in stored:
        if key in ("name", "task") or key in SCHEDULE or key in SECRET_FIELDS:
            continue
        if key not in new:
            values[key] = None
    return values
