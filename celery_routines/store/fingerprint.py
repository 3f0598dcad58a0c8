"""The schedule fingerprint: what ``next_run_at`` was computed from.

``cron | interval_seconds | timezone | at | solar | rrule | starts_at |
ends_at | jitter_seconds [| schedules | exclude | shift] | on/off``, spelled by the database
itself from the row's own columns, both when it is stored (adoption, a
recomputation) and when it is compared: a float or a NULL reads the same on
both sides whatever the dialect, so a row edited by plain SQL is told apart
from one beat wrote without any trigger or ``updated_at`` discipline.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, String, and_, case, cast, func, literal

from .models import ROUTINES
from .records import ROUTINE_RECORD_FIELDS

table = ROUTINES
c = table.c

COMPUTED = "schedule_changed"


def current_fingerprint() -> ColumnElement[str]:
    """The fingerprint of the row's columns as they are now."""
    text = lambda value: func.coalesce(value, literal("", String))  # noqa: E731
    sep = literal("|", String)
    return (
        text(c.cron)
        + sep
        + text(cast(c.interval_seconds, String))
        + sep
        + text(c.timezone)
        # The schedule kinds and bounds of issue 16, before on/off: the
        # refresh reads a disabled routine's fingerprint by its "|off" end.
        + sep
        + text(cast(c.at, String))
        + sep
        + text(c.solar)
        + sep
        + text(c.rrule)
        + sep
        + text(cast(c.starts_at, String))
        + sep
        + text(cast(c.ends_at, String))
        + sep
        + text(cast(c.jitter_seconds, String))
        + calendar_part(sep, text)
        + sep
        + case((c.enabled, literal("on", String)), else_=literal("off", String))
    )


def calendar_part(sep: Any, text: Any) -> ColumnElement[str]:
    """The calendar columns of issue 34, spelled only when one is set: a row
    without them keeps the fingerprint it was stored with before they existed
    (no routine is rescheduled by the upgrade). NULLIF, not a CASE on IS NOT
    NULL: SQLite 3.4x evaluated that CASE as true for NULL columns inside
    UPDATE ... RETURNING (the claim), seen as every routine "changed"."""
    spelled = sep + text(c.schedules) + sep + text(c.exclude) + sep + text(c.shift)
    return func.coalesce(func.nullif(spelled, literal("|||", String)), literal("", String))


def schedule_changed() -> ColumnElement[bool]:
    """True for a row whose schedule changed since its ``next_run_at`` was
    computed (a row never fingerprinted has not changed: it is baselined)."""
    return and_(
        c.schedule_fingerprint.is_not(None), c.schedule_fingerprint != current_fingerprint()
    )


def record_columns(prefix: str = "") -> list[Any]:
    """The columns of a ``RoutineRecord``, in its field order, labelled
    ``prefix + field`` when a prefix is given."""
    columns: list[Any] = []
    for name in ROUTINE_RECORD_FIELDS:
        column: Any = schedule_changed() if name == COMPUTED else c[name]
        columns.append(column.label(prefix + name) if prefix or name == COMPUTED else column)
    return columns
