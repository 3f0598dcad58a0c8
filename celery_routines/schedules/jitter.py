"""Deterministic jitter: a routine's windows go out a fixed offset after them.

A routine with ``jitter=N`` sends each window at ``window + offset``, where
``offset`` is a whole number of seconds in ``[0, N)`` derived from the
routine's name (the part of every window key that does not change): a hash,
not a random draw, so every beat computes the same instant, and a thousand
``0 * * * *`` routines spread over ``N`` seconds instead of hitting the
broker in the same second. The window itself (its key, what the DST rules
decided) stays the nominal one; lateness is measured from the send instant.

One offset per routine (rather than one per window) makes the send instant
and the window a bijection: the stored ``next_run_at`` is the send instant
and the window is ``next_run_at - offset``, with no second column, and
planning a jittered routine is planning its windows at ``now - offset``.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from celery_routines.schedules.base import NEVER

__all__ = ["jitter_offset", "send_instant", "window_of"]


def jitter_offset(routine_name: str, jitter: int | None) -> timedelta:
    """The offset of every window of ``routine_name``: ``[0, jitter)`` whole seconds."""
    if not jitter or jitter < 1:
        return timedelta(0)  # no jitter (a bad value never reaches here: the model refuses it)
    digest = hashlib.sha256(routine_name.encode()).digest()
    return timedelta(seconds=int.from_bytes(digest[:8], "big") % jitter)


def send_instant(window: datetime, routine_name: str, jitter: int | None) -> datetime:
    """When ``window`` goes out (an ended schedule's :data:`NEVER` stays NEVER)."""
    if window >= NEVER:
        return window
    return window + jitter_offset(routine_name, jitter)


def window_of(sent_at: datetime, routine_name: str, jitter: int | None) -> datetime:
    """The window whose send instant is ``sent_at``."""
    if sent_at >= NEVER:
        return sent_at
    return sent_at - jitter_offset(routine_name, jitter)
