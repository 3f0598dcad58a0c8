"""Routines as a reviewable file: ``celery routines export`` and
``celery routines import file PATH``.

The file holds definitions only (no runs, no next window, no pause): what
``define`` takes, one object per routine, keyed by name, JSON or YAML. A
value equal to its default is left out, so a file reads like the
declaration that would make it, and ``export | import file`` changes
nothing: each entry goes through ``define`` and compares equal to the
columns it came from.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery_routines.errors import ScheduleError
from celery_routines.extras import MissingExtra, require
from celery_routines.operator.importers.django_celery_beat import ImportSourceError
from celery_routines.operator.importers.plan import ImportPlan, Planned, Unmappable
from celery_routines.policy.ceilings import parse_ceilings
from celery_routines.policy.routine import JSON_COLUMNS, OPTIONS, define
from celery_routines.schedules.solar import SolarSchedule
from celery_routines.store import RoutineRecord

SOURCE = "file"
OWNER = f"import:{SOURCE}"
FORMAT_VERSION = 1
# The definition as the file spells it: (key, column), each option by its
# keyword (a schedule's fields by the CLI's name), as declared.
FILE_KEYS = {"interval_seconds": "every", "schedules": "schedule"}
FIELDS: tuple[tuple[str, str], ...] = (
    ("task", "task"),
    *((FILE_KEYS.get(o.name) or o.keyword_name or o.name, o.column_name) for o in OPTIONS),
)
KEYS = frozenset(key for key, _ in FIELDS)
# One of these is the schedule (or ``at`` alone, a one-off).
SCHEDULE_KEYS = ("cron", "every", "solar", "rrule", "schedule")
# The largest file read (checked before reading it) and the largest value one
# entry's key may hold, as JSON; args, kwargs and options have their own
# (smaller) limits in the routine model.
MAX_FILE_BYTES = 5 * 1024 * 1024
MAX_VALUE_BYTES = 64 * 1024


# Columns whose value holds a secret (a notify_url's token), masked by --mask.
SECRET_COLUMNS = {o.column_name: o.shown for o in OPTIONS if o.secret}


def export(records: list[RoutineRecord], *, mask: bool = False) -> dict[str, Any]:
    """The definitions of ``records`` (retired ones left out), by name; a
    value a routine has by default is left out. ``mask``: secrets as ``show``
    prints them (for review; such a file is not imported back as it is)."""
    routines: dict[str, Any] = {}
    for record in sorted(records, key=lambda r: r.name):
        if record.retired_at is not None:
            continue
        entry: dict[str, Any] = {}
        for key, column in FIELDS:
            value = _exported(column, getattr(record, column))
            if mask and column in SECRET_COLUMNS and value:
                value = SECRET_COLUMNS[column](value)
            if key == "task" or value != DEFAULTS.get(column):
                entry[key] = value
        routines[record.name] = entry
    return {"version": FORMAT_VERSION, "routines": routines}


def _exported(column: str, value: Any) -> Any:
    if column == "ceiling":
        return [c.as_json() for c in parse_ceilings(value)]
    if column in JSON_COLUMNS:
        return json.loads(value) if value else []
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


# A default routine's values as the file spells them: left out.
DEFAULTS = {
    column: _exported(column, value)
    for column, value in define("defaults", 60).columns().items()
    if column not in ("name", "task", "interval_seconds")
}


def dumps(data: Mapping[str, Any], fmt: str) -> str:
    if fmt == "yaml":
        yaml = _yaml()
        return str(yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True))
    return json.dumps(data, indent=2) + "\n"


def write_whole(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a file beside it renamed over it:
    a reader never sees half a file, and a failed write leaves the old one
    (or none). The file is readable by its owner only: it holds secrets."""
    target = Path(path)
    try:
        handle, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError as exc:
        raise ImportSourceError(f"cannot write {path}: {exc}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(partial, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise ImportSourceError(f"cannot write {path}: {exc}") from None


def read(path: str) -> ImportPlan:
    """The import plan of the file at ``path`` (``.yaml``/``.yml`` is YAML, else JSON)."""
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ImportSourceError(
                f"{path} is too large: {size} bytes, at most {MAX_FILE_BYTES} "
                "(split it, or import with the Python API)"
            )
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ImportSourceError(f"cannot read {path}: {exc}") from None
    try:
        if file.suffix.lower() in (".yaml", ".yml"):
            data = _yaml().load(text, Loader=_loader())
        else:
            data = json.loads(text)
    except (MissingExtra, ImportSourceError):
        raise
    except Exception as exc:  # json's and yaml's parse errors share no base
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ImportSourceError(f"{path} does not parse: {first}") from None
    entries = data.get("routines") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise ImportSourceError(
            f"{path} is not a routines file: expected an object with 'routines' "
            "(name -> definition), as `celery routines export` writes"
        )
    plan = ImportPlan(SOURCE, OWNER, exclusive=False)
    for name, entry in entries.items():
        try:
            plan.routines.append(Planned(_define(str(name), entry)))
        except (ScheduleError, ValueError, TypeError, OverflowError) as exc:
            plan.unmappable.append(Unmappable(str(name), getattr(exc, "problem", None) or str(exc)))
    return plan


def _define(name: str, entry: Any) -> Any:
    if not isinstance(entry, dict):
        raise ScheduleError(f"its definition must be an object, got {entry!r}")
    unknown = set(entry) - KEYS
    if unknown:
        raise ScheduleError(
            f"unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(KEYS))}"
        )
    for key, value in entry.items():
        _check_size(key, value)
    if "task" not in entry:
        raise ScheduleError("its task is missing")
    if not isinstance(entry["task"], str):
        raise ScheduleError(f"its task must be a task name, got {entry['task']!r}")
    kinds = [k for k in SCHEDULE_KEYS if entry.get(k) is not None]
    given = {k: v for k, v in entry.items() if k not in ("task", *SCHEDULE_KEYS)}
    if len(kinds) > 1:
        raise ScheduleError(f"give one schedule, got {', '.join(kinds)}")
    schedule: Any = None
    if "cron" in kinds:
        schedule = entry["cron"]
    elif "every" in kinds:
        if isinstance(entry["every"], bool) or not isinstance(entry["every"], int | float):
            raise ScheduleError(f"every must be a number of seconds, got {entry['every']!r}")
        try:
            schedule = timedelta(seconds=entry["every"])
        except (OverflowError, ValueError):
            raise ScheduleError(
                f"every must be a number of seconds a timedelta holds, got {entry['every']!r}"
            ) from None
    elif "solar" in kinds:
        schedule = SolarSchedule.from_spec(entry["solar"])
    elif "rrule" in kinds:
        schedule = entry["rrule"]
    elif "schedule" in kinds:
        if not isinstance(entry["schedule"], list):
            raise ScheduleError(
                f"schedule must be a list of crons, rrules and intervals, got {entry['schedule']!r}"
            )
        schedule = entry["schedule"]
    if "exclude" in given:
        if not isinstance(given["exclude"], list):
            raise ScheduleError(f"exclude must be a list, got {given['exclude']!r}")
        given["exclude"] = tuple(given["exclude"])
    if "ceiling" in given:
        given["ceiling"] = parse_ceilings(json.dumps(given["ceiling"]))
    if isinstance(given.get("args"), list):
        given["args"] = tuple(given["args"])
    return define(str(entry["task"]), schedule, name=name, **given)


def _check_size(key: str, value: Any) -> None:
    """A key's value is at most MAX_VALUE_BYTES of JSON (args, kwargs and
    options are then checked for depth and size by the model)."""
    if isinstance(value, str | int | float | bool) or value is None:
        size = len(str(value).encode("utf-8"))
    else:
        try:
            size = len(json.dumps(value, default=str).encode("utf-8"))
        except (ValueError, TypeError, RecursionError):
            raise ScheduleError(f"{key} is not a JSON value") from None
    if size > MAX_VALUE_BYTES:
        raise ScheduleError(f"{key} is too large: {size} bytes, at most {MAX_VALUE_BYTES}")


class _NoAliases(Exception):
    pass


def _loader() -> Any:
    """PyYAML's safe loader refusing anchors and aliases: a routines file
    needs neither, and an alias bomb of a few hundred bytes would otherwise
    expand to gigabytes. Refused as the event is read, before anything is
    built."""
    yaml = _yaml()

    class NoAliasLoader(yaml.SafeLoader):  # type: ignore[name-defined]
        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                mark = event.start_mark
                raise _NoAliases(
                    f"anchors and aliases (&, *) are not accepted (line {mark.line + 1})"
                )
            return super().compose_node(parent, index)

    return NoAliasLoader


def _yaml() -> Any:
    # The yaml extra brings PyYAML; JSON needs nothing.
    return require("yaml", "YAML (export --format yaml, import file *.yaml)")
