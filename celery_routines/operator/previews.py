"""``preview``: the windows of a schedule written on one line, or of a
stored routine, with DST notes.

A schedule on one line is spelled as ``list`` prints the SCHEDULE column,
so what ``list`` shows can be pasted back: a cron (``30 2 * * *``,
``@daily``), ``every 20s``, ``at 2026-12-24T18:00`` (or ``once at ...``), a
solar event (``sunrise 45.46 9.19``), an RFC 5545 rule (``DTSTART:... RRULE:...``,
optionally after ``rrule``), or several crons, intervals and rules joined by
`` + `` (their union). The text only picks which of ``add``'s options it is;
the definition is then built by ``add``'s own parser
(:func:`celery_routines.operator.manage.new_definition`), so a schedule
previews exactly as it would be stored, with the same messages. No I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from celery_routines.clock import Clock, utc_now
from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.operator.manage import new_definition
from celery_routines.operator.texts import duration
from celery_routines.operator.views import WindowView, window_view
from celery_routines.operator.windows import (
    MAX_PREVIEW,
    ONE_MICROSECOND,
    check_count,
    take_windows,
    to_instant,
)
from celery_routines.schedules.base import Schedule, first_window, is_never
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.jitter import window_of
from celery_routines.schedules.keys import window_key
from celery_routines.schedules.parse import schedule_of
from celery_routines.schedules.rrule import looks_like_rrule
from celery_routines.schedules.solar import EVENTS as SOLAR_EVENTS
from celery_routines.store import RoutineRecord

UNION = " + "
# The name and task a previewed definition is checked under (never stored).
PREVIEW_NAME = "preview"
PREVIEW_TASK = "preview.check"
FORMS = (
    "a cron such as '30 2 * * *', 'every 20s', 'at 2026-12-24T18:00', 'sunrise 45.46 9.19', "
    "an rrule, or several joined by ' + '"
)


class NotASchedule(ScheduleError):
    """The text reads as no schedule (it may be a routine's name)."""


def schedule_options(text: str) -> dict[str, Any]:
    """``add``'s schedule option for a one-line schedule: ``{"cron": ...}``,
    ``{"every": ...}``, ``{"at": ...}``, ``{"solar": ...}`` or ``{"rrule": ...}``;
    a union is ``{"cron": [...]}`` (what ``--cron`` repeated gives ``add``),
    its intervals as seconds."""
    raw = " ".join(text.split())
    parts = raw.split(UNION)
    if len(parts) > 1:
        return {"cron": [_member(part) for part in parts]}
    lowered = raw.lower()
    if lowered.startswith("every "):
        return {"every": raw[len("every ") :]}
    for prefix in ("once at ", "at "):
        if lowered.startswith(prefix):
            return {"at": raw[len(prefix) :]}
    if lowered.startswith("solar "):
        return {"solar": raw[len("solar ") :]}
    if raw.split(" ", 1)[0] in SOLAR_EVENTS:
        return {"solar": raw}
    if lowered.startswith("rrule ") or looks_like_rrule(raw):
        return {"rrule": _rule(raw)}
    return {"cron": raw}


def _member(part: str) -> str | float:
    """One spec of a union: a cron or rule as text, an interval as seconds."""
    if part.lower().startswith("every "):
        return duration(part[len("every ") :], "every").total_seconds()
    if part.lower().startswith("rrule ") or looks_like_rrule(part):
        return _rule(part)
    return part


def _rule(text: str) -> str:
    # `list` writes a rule's lines on one line, after "rrule".
    body = text[len("rrule ") :] if text.lower().startswith("rrule ") else text
    return "\n".join(body.split())


def parse_preview(
    text: str, timezone: str, exclude: Sequence[str] = (), shift: str | None = None
) -> Schedule:
    """The schedule ``text`` makes in ``timezone`` with the calendar options,
    through ``add``'s parser. :class:`NotASchedule` when the text itself
    does not read (whatever the options); a bad option is its own error."""
    try:
        options = schedule_options(text)
        new_definition(PREVIEW_NAME, PREVIEW_TASK, "UTC", **options)
    except (InvalidRoutine, ValueError, OverflowError) as exc:
        raise NotASchedule(getattr(exc, "problem", None) or str(exc)) from None
    try:
        definition = new_definition(
            PREVIEW_NAME,
            PREVIEW_TASK,
            timezone,
            timezone=timezone,
            exclude=list(exclude) or None,
            shift=shift,
            **options,
        )
    except InvalidRoutine as exc:
        raise ScheduleError(exc.problem) from None
    return schedule_of(definition, timezone)


def preview(
    spec: str,
    timezone: str = "UTC",
    start: datetime | str | None = None,
    n: int = 10,
    *,
    clock: Clock = utc_now,
    exclude: Sequence[str] = (),
    shift: str | None = None,
) -> list[WindowView]:
    """The next ``n`` windows of ``spec`` (a one-line schedule) in
    ``timezone`` from ``start`` (inclusive). Needs no database. A naive or
    string ``start`` is read in ``timezone``. ``exclude`` and ``shift`` are
    the routine options of the same names, so a calendar can be checked
    before it is saved."""
    check_count("n", n, MAX_PREVIEW)
    schedule = parse_preview(spec, timezone, exclude, shift)
    # From the whole second, as beat adopts a routine: an interval's windows
    # (and their keys) carry no microseconds.
    now = clock().replace(microsecond=0)
    after = to_instant(start, timezone, now, "--from")
    if "every" not in schedule_options(spec):
        after -= ONE_MICROSECOND  # a window at the start is one; an interval starts there
    return [
        window_view(schedule, w, timezone=timezone) for w in _windows(schedule, after, n, start)
    ]


def routine_windows(
    record: RoutineRecord,
    schedule: Schedule,
    timezone: str,
    start: datetime | str | None,
    n: int,
    now: datetime,
) -> list[WindowView]:
    """The next ``n`` windows of a stored routine, as beat computes them:
    from its stored next window (else the first beat would adopt from
    ``now``), or the first of its windows at or after ``start``; an
    interval stays on its own grid."""
    check_count("n", n, MAX_PREVIEW)
    stored = record.next_run_at
    if is_never(stored):
        return []  # done: no window left
    if stored is not None and record.last_error is None:
        anchor = window_of(stored, record.name, record.jitter_seconds)
    else:
        # Beat adopts from the whole second (tick/engine.py).
        anchor = first_window(schedule, now.replace(microsecond=0))
        if is_never(anchor):
            return []
    if start is None:
        found = [anchor, *_windows(schedule, anchor, n - 1, anchor)]
    else:
        begin = to_instant(start, timezone, now, "--from")
        if record.interval_seconds is not None and begin > anchor:
            step = IntervalSchedule(record.interval_seconds).step
            steps = -((anchor - begin) // step)  # ceil: the first grid window >= begin
            found = _windows(schedule, anchor + (steps - 1) * step, n, start)
        elif record.interval_seconds is not None:
            found = [anchor, *_windows(schedule, anchor, n - 1, start)]
        else:
            found = _windows(schedule, begin - ONE_MICROSECOND, n, start)
    return [
        window_view(schedule, w, window_key(record.name, w, timezone), timezone) for w in found[:n]
    ]


def _windows(schedule: Schedule, after: datetime, n: int, start: object) -> list[datetime]:
    if n <= 0:
        return []
    try:
        return take_windows(schedule, after, n)
    except OverflowError:
        raise ValueError(
            f"--from {start!r}: {n} windows from there run past the end of the calendar "
            f"(year 9999); start earlier or ask for fewer (-n)"
        ) from None
