"""The beats as the operator sees them (issue 33): every beat process that
ticked in the last hour, from its heartbeat row, for ``GET /api/beats``, the
panel's Beats page and ``celery routines beats``.

A beat is ``stale`` when it has been silent for longer than three of its own
longest gaps between two heartbeats (30 s with the default
``routines_refresh_seconds`` of 5; see tick/heartbeat.py): stopped, frozen,
or cut off from the database. How long ago it ticked is measured on the
database's clock.
"""

from __future__ import annotations

from typing import Any

from celery_routines.store import Store
from celery_routines.store.beats import BeatRow


def beats_of(store: Store) -> list[dict[str, Any]]:
    """The beats that ticked in the last hour, as the API answers them."""
    return [beat_fields(row) for row in store.beats.recent()]


def beat_fields(row: BeatRow) -> dict[str, Any]:
    """One beat as the API answers it (and the page shows it)."""
    return {
        "beat_id": row.beat_id,
        "host": row.host,
        "pid": row.pid,
        "started_at": row.started_at.isoformat(),
        "last_tick_at": row.last_tick_at.isoformat(),
        "seconds_since_tick": round(row.seconds_since_tick, 1),
        "stale": row.stale,
        "stale_after_seconds": row.stale_after_seconds,
        "tick_p50_ms": _rounded(row.tick_p50_ms),
        "tick_p99_ms": _rounded(row.tick_p99_ms),
        "ticks_measured": row.ticks_measured,
        "claims_held": row.claims_held,
        "clock_skew_seconds": round(row.clock_skew_seconds, 3) + 0.0,  # never "-0.000"
        "publish_processes": row.publish_processes,
        "version": row.version,
    }


def _rounded(milliseconds: float | None) -> float | None:
    return None if milliseconds is None else round(milliseconds, 2)
