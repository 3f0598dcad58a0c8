"""The beats (issue 33, item 4): ``GET /api/beats`` and the Beats page.

Every beat process that ticked in the last hour, from its heartbeat row
(``routine_beats``, written by the beat itself: tick/heartbeat.py), with how
long ago it ticked on the database's clock. A beat silent for longer than
three of its own longest gaps between two heartbeats (30 s with the default
``routines_refresh_seconds`` of 5) is ``stale``: stopped, frozen, or cut off
from the database.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from celery_routines.operator.web.api import answer
from celery_routines.operator.web.context import panel_of, render
from celery_routines.operator.web.pages import page
from celery_routines.store.beats import RECENT, BeatRow


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
        "clock_skew_seconds": round(row.clock_skew_seconds, 3),
        "publish_processes": row.publish_processes,
        "version": row.version,
    }


def _rounded(milliseconds: float | None) -> float | None:
    return None if milliseconds is None else round(milliseconds, 2)


def recent_beats(request: Request) -> list[dict[str, Any]]:
    return [beat_fields(row) for row in panel_of(request).admin.store.beats.recent()]


def list_beats(request: Request) -> dict[str, Any]:
    beats = recent_beats(request)
    return {"beats": beats, "stale": sum(1 for beat in beats if beat["stale"])}


def beats_page(request: Request) -> Response:
    beats = recent_beats(request)
    return render(
        request,
        "beats.html",
        beats=beats,
        stale=sum(1 for beat in beats if beat["stale"]),
        within_minutes=int(RECENT.total_seconds() // 60),
    )


def routes() -> list[Route]:
    return [
        Route("/api/beats", answer(list_beats)),
        Route("/beats", page(beats_page)),
    ]
