"""Deterministic idempotency keys for windows (contract guarantee 2).

The key is the routine name plus the window's instant written in the
routine's zone with its offset, e.g. ``nightly@2026-03-29T03:30:00+02:00``.
Writing the offset keeps the two passes of a repeated autumn hour apart
(``02:30+02:00`` vs ``02:30+01:00``) while staying readable to operators.
"""

from __future__ import annotations

from datetime import UTC, datetime

from celery_routines.schedules.zones import aware_utc, load_zone

__all__ = ["skip_key", "window_in_key", "window_key"]


def window_key(routine_name: str, window_utc: datetime, timezone: str) -> str:
    """``<routine_name>@<window in timezone, ISO 8601 with offset>``."""
    local = aware_utc(window_utc, "window_utc").astimezone(load_zone(timezone))
    return f"{routine_name}@{local.isoformat()}"


def skip_key(routine_name: str, first: datetime, last: datetime, count: int, timezone: str) -> str:
    """The key of a ``skipped`` row summarising ``count`` windows from
    ``first`` to ``last``: the first window's key (``name@first``), or
    ``name@first..last`` for several, so it never collides with a window
    that was sent."""
    key = window_key(routine_name, first, timezone)
    if count > 1:
        key += ".." + window_key(routine_name, last, timezone).split("@", 1)[1]
    return key


def window_in_key(routine_name: str, key: str) -> datetime | None:
    """The window (UTC) that ``key`` names for ``routine_name``: the inverse of
    :func:`window_key`; None for another routine's key, a skip summary's key
    (``first..last``) or anything else that is not a window key."""
    prefix = f"{routine_name}@"
    if not key.startswith(prefix):
        return None
    instant = key[len(prefix) :]
    if ".." in instant:
        return None
    try:
        local = datetime.fromisoformat(instant)
    except ValueError:
        return None
    return local.astimezone(UTC) if local.tzinfo is not None else None
