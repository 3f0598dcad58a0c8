"""``GET /api/beats`` and the Beats page (issue 33, item 4) in process, over
heartbeat rows in a real store: every beat of the last hour with its fields,
a silent one ``stale`` with how long ago it ticked, behind the panel's guards."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from celery_routines.operator.admin import Routines
from celery_routines.operator.web.auth import WebAuth
from celery_routines.store import Store
from tests.operator.web.conftest import BEARER, TOKEN, client_for
from tests.store.test_beats import two_beats

FIELDS = {
    "beat_id",
    "host",
    "pid",
    "started_at",
    "last_tick_at",
    "seconds_since_tick",
    "stale",
    "stale_after_seconds",
    "tick_p50_ms",
    "tick_p99_ms",
    "ticks_measured",
    "claims_held",
    "clock_skew_seconds",
    "publish_processes",
    "version",
}


def test_the_api_lists_every_recent_beat_and_marks_the_silent_one_stale(
    admin: Routines, store: Store
) -> None:
    two_beats(store)
    answer = client_for(admin).get("/api/beats")
    assert answer.status_code == 200
    body = answer.json()
    by_id = {beat["beat_id"]: beat for beat in body["beats"]}
    assert set(by_id) == {"host-a:101:live", "host-b:202:dead"}
    assert body["stale"] == 1
    live, dead = by_id["host-a:101:live"], by_id["host-b:202:dead"]
    assert set(live) == FIELDS
    assert (live["host"], live["pid"], live["stale"]) == ("host-a", 101, False)
    assert (live["tick_p50_ms"], live["tick_p99_ms"], live["claims_held"]) == (1.5, 12.25, 0)
    assert (live["publish_processes"], live["version"]) == (2, "0.1.0")
    assert live["seconds_since_tick"] < 5
    assert dead["stale"] is True
    assert 45 <= dead["seconds_since_tick"] < 55
    assert dead["stale_after_seconds"] == 30.0


def test_the_beats_page_says_stale_in_words_and_is_in_the_nav(
    admin: Routines, store: Store
) -> None:
    two_beats(store)
    client = client_for(admin)
    page = client.get("/beats")
    assert page.status_code == 200
    html = page.text
    assert 'href="/beats">Beats</a>' in html
    assert 'data-beat="host-b:202:dead"' in html
    dead_row = html.split('data-beat="host-b:202:dead"')[1].split("</tr>")[0]
    assert "STALE</b>: no tick for" in dead_row
    live_row = html.split('data-beat="host-a:101:live"')[1].split("</tr>")[0]
    assert "STALE" not in live_row and ">live<" in live_row
    assert '<strong id="beats-stale-count">1 stale</strong>' in html
    # No beat at all: the page says so.
    store.beats.prune(datetime.now(UTC) + timedelta(days=2))
    assert "no beat ticked in the last 60 minutes" in client.get("/beats").text


def test_the_beats_are_behind_the_panels_guards(admin: Routines, store: Store) -> None:
    two_beats(store)
    client = client_for(admin, auth=WebAuth(token=TOKEN))
    assert client.get("/api/beats").status_code == 401
    assert client.get("/beats").status_code == 401
    assert client.get("/api/beats", headers=BEARER).status_code == 200
    assert client.get("/api/beats", headers={**BEARER, "Host": "evil.example"}).status_code == 400
    # Read-only: a GET, listed in the API's own document.
    assert client.post("/api/beats", headers=BEARER).status_code == 405
    assert "/api/beats" in client.get("/api/openapi.json", headers=BEARER).json()["paths"]
