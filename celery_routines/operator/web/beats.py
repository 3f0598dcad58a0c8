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

from celery_routines.operator.beats import beats_of
from celery_routines.operator.web.api import answer
from celery_routines.operator.web.context import panel_of, render
from celery_routines.operator.web.pages import page
from celery_routines.store.beats import RECENT


def recent_beats(request: Request) -> list[dict[str, Any]]:
    return beats_of(panel_of(request).admin.store)


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
