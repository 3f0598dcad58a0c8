"""Every schedule in words, beside its expression: ``30 2 * * 1-5``
in Rome reads "At 02:30, Monday through Friday (Europe/Rome)".

Crons are put in words by ``cron-descriptor`` (a base dependency, imported
here only when a cron is first described): when it is missing, or does not
read an expression, the words fall back to the expression itself, so a
listing never fails on its wording. Intervals, one-offs, solar events,
recurrence rules and unions (``schedule=[...]``) are worded here, in the
same style. Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

from celery_routines.schedules.zones import load_zone
from celery_routines.store import RoutineRecord

__all__ = ["cron_words", "interval_words", "rrule_words", "schedule_words", "solar_words",
           "union_words"]  # fmt: skip

# Ordinals (1#2 is "the second Monday") and what a cron reads as "any".
_ANY = ("*", "?")
_UNITS = ((86_400, "day"), (3_600, "hour"), (60, "minute"), (1, "second"))
_DAYS = {"MO": "Monday", "TU": "Tuesday", "WE": "Wednesday", "TH": "Thursday",
         "FR": "Friday", "SA": "Saturday", "SU": "Sunday"}  # fmt: skip
_FREQ = {"YEARLY": "year", "MONTHLY": "month", "WEEKLY": "week", "DAILY": "day",
         "HOURLY": "hour", "MINUTELY": "minute", "SECONDLY": "second"}  # fmt: skip
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")  # fmt: skip


def schedule_words(record: RoutineRecord, timezone: str) -> str:
    """The routine's schedule as a sentence, its zone named where the
    schedule is read in it: "At 02:30, Monday through Friday (Europe/Rome)"."""
    core, zoned = _core(record, timezone)
    extra = []
    if record.starts_at is not None:
        extra.append(f"from {_local(record.starts_at, timezone)}")
    if record.ends_at is not None:
        extra.append(f"until {_local(record.ends_at, timezone)}")
    if record.exclude:
        extra.append("except " + _exclusions(record.exclude))
    if record.shift:
        extra.append("moved to the " + record.shift.replace("_", " ") + " when excluded")
    if record.jitter_seconds:
        extra.append(f"each up to {interval_words(record.jitter_seconds, bare=True)} late (jitter)")
    text = ", ".join([core, *extra])
    return f"{text} ({timezone})" if zoned or extra else text


def _core(record: RoutineRecord, timezone: str) -> tuple[str, bool]:
    """(the words, whether the schedule is read in the routine's zone)."""
    if record.cron is not None:
        return cron_words(record.cron), True
    if record.interval_seconds is not None:
        return interval_words(record.interval_seconds), False
    if record.at is not None:
        return f"Once, at {_local(record.at, timezone)}", True
    if record.solar is not None:
        return solar_words(record.solar), False
    if record.rrule is not None:
        return rrule_words(record.rrule), True
    if record.schedules is not None:
        return union_words(record.schedules)
    return "No schedule", False


def union_words(raw: str) -> tuple[str, bool]:
    """``schedule=[...]``: each spec's words, joined (the union of their windows)."""
    try:
        specs = json.loads(raw)
    except ValueError:
        return raw, False
    if not isinstance(specs, list) or not specs:
        return str(raw), False
    parts, zoned = [], False
    for spec in specs:
        if isinstance(spec, str) and "FREQ=" in spec.upper():
            parts.append(rrule_words(spec))
            zoned = True
        elif isinstance(spec, str):
            parts.append(cron_words(spec))
            zoned = True
        elif isinstance(spec, int | float) and not isinstance(spec, bool):
            parts.append(interval_words(spec))
        else:
            parts.append(str(spec))
    rest = [p[:1].lower() + p[1:] for p in parts[1:]]
    return "; and ".join([parts[0], *rest]), zoned


@functools.lru_cache(maxsize=4096)
def cron_words(expression: str) -> str:
    """A cron in plain English (24-hour clock). A cron that restricts both the
    day of the month and the day of the week fires on either (the usual cron
    rule, and croniter's), which cron-descriptor would read as "and": those
    are worded here with "or"."""
    from celery_routines.schedules.cronspec import ALIASES, parse_cron

    try:
        parse_cron(expression)
    except ValueError:
        return expression  # invalid: the routine's error says why
    fields = expression.split()
    if len(fields) == 1 and fields[0].lower() in ALIASES:
        fields = ALIASES[fields[0].lower()].split()
    try:
        from cron_descriptor import ExpressionDescriptor, Options  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - a base dependency; words fall back
        return expression
    options = Options()
    options.use_24hour_time_format = True
    options.verbose = False
    try:
        descriptor = ExpressionDescriptor(" ".join(fields), options)
        if len(fields) == 5 and fields[2] not in _ANY and fields[4] not in _ANY:
            days = descriptor.get_day_of_week_description().lstrip(", ")
            days = days.removeprefix("only ")
            return (
                descriptor.get_time_of_day_description()
                + descriptor.get_day_of_month_description()
                + f" or {days}"
                + descriptor.get_month_description()
            )
        return str(descriptor.get_description())
    except Exception:  # any wording failure shows the expression
        return expression


def interval_words(seconds: float, *, bare: bool = False) -> str:
    """``Every 5 minutes``, ``Every hour``, ``Every 90 seconds``; ``bare``:
    ``5 minutes``."""
    value = float(seconds)
    found = [(int(value // size), unit) for size, unit in _UNITS
             if value >= size and (value / size).is_integer()]  # fmt: skip
    if not found:
        amount = f"{value:g} seconds"
    elif found[0][0] == 1:
        amount = f"1 {found[0][1]}" if bare else found[0][1]
    else:
        amount = f"{found[0][0]} {found[0][1]}s"
    return amount if bare else f"Every {amount}"


def solar_words(spec: str) -> str:
    """``At sunrise at latitude 45.46, longitude 9.19``; ``dusk_civil`` is civil dusk."""
    parts = spec.split()
    if len(parts) != 3:
        return f"Solar {spec}"
    event, lat, lon = parts
    first, _, second = event.partition("_")
    name = f"{second} {first}" if first in ("dawn", "dusk") and second else event.replace("_", " ")
    return f"At {name} at latitude {lat}, longitude {lon}"


def rrule_words(rule: str) -> str:
    """An RFC 5545 rule in words: ``Every 2 weeks on Monday and Wednesday at
    09:00, 10 times``. Parts not worded here leave the rule as written."""
    parts: dict[str, str] = {}
    start = None
    for line in rule.split():
        head, _, body = line.partition(":")
        if head.upper().startswith("DTSTART"):
            start = body
            continue
        for item in (body if head.upper() == "RRULE" else line).split(";"):
            key, _, value = item.partition("=")
            if value:
                parts[key.upper()] = value.upper()
    freq = _FREQ.get(parts.pop("FREQ", ""))
    known = {"INTERVAL", "BYDAY", "BYHOUR", "BYMINUTE", "BYMONTHDAY", "BYMONTH", "COUNT", "UNTIL"}
    if freq is None or set(parts) - known:
        return "Recurrence rule " + " ".join(rule.split())
    raw_interval = parts.get("INTERVAL", "1")
    interval = int(raw_interval) if raw_interval.isdigit() else 1
    text = f"Every {freq}" if interval == 1 else f"Every {interval} {freq}s"
    if "BYMONTH" in parts:
        text += " in " + _and([_month(m) for m in parts["BYMONTH"].split(",")])
    if "BYMONTHDAY" in parts:
        text += " on day " + _and(parts["BYMONTHDAY"].split(",")) + " of the month"
    if "BYDAY" in parts:
        text += " on " + _and([_weekday(d) for d in parts["BYDAY"].split(",")])
    time = _rrule_time(parts, start)
    if time:
        text += f" at {time}"
    if "COUNT" in parts:
        text += f", {parts['COUNT']} times"
    if "UNTIL" in parts:
        text += f", until {parts['UNTIL']}"
    return text


def _rrule_time(parts: dict[str, str], start: str | None) -> str | None:
    hour_minute = start.partition("T")[2][:4] if start and "T" in start else ""
    hours = parts.get("BYHOUR", "").split(",") if "BYHOUR" in parts else None
    minute = parts.get("BYMINUTE") or (hour_minute[2:4] if len(hour_minute) == 4 else None)
    if hours is None and len(hour_minute) == 4:
        hours = [hour_minute[:2]]
    if hours is None or minute is None or "," in minute:
        return None
    return _and([f"{int(h):02d}:{int(minute):02d}" for h in hours if h.isdigit()]) or None


def _weekday(code: str) -> str:
    day = _DAYS.get(code[-2:], code)
    ordinal = code[:-2]
    if not ordinal:
        return day
    return {"1": "the first ", "2": "the second ", "3": "the third ", "4": "the fourth ",
            "-1": "the last "}.get(ordinal.lstrip("+"), ordinal + " ") + day  # fmt: skip


def _month(number: str) -> str:
    return _MONTHS[int(number) - 1] if number.isdigit() and 1 <= int(number) <= 12 else number


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _local(instant: datetime, timezone: str) -> str:
    """``2026-12-24 12:00``, with its seconds when it has some (a one-off at
    12:00:30 does not read as 12:00)."""
    try:
        local = instant.astimezone(load_zone(timezone))
    except ValueError:
        return instant.isoformat()
    return local.strftime("%Y-%m-%d %H:%M:%S" if local.second else "%Y-%m-%d %H:%M")


def _exclusions(raw: str) -> str:
    try:
        from celery_routines.schedules.exclusions import exclusion_entries

        return "; ".join(exclusion_entries(raw))
    except ValueError:
        return raw
