"""The panel's pages in process: what they show, the forms' CSRF guard, the
read-only mode, escaping and masked secrets."""

from __future__ import annotations

import html
import re
from datetime import timedelta

from celery_routines.operator.admin import Routines
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.operator.web.conftest import BASE_URL, BEARER, client_for
from tests.operators import add_routine, add_run

SCRIPT = "<script>alert(1)</script>"


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def test_the_routines_page_shows_state_next_window_and_the_strip(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    routine = add_routine(
        store,
        "nightly",
        cron="30 2 * * *",
        timezone="Europe/Rome",
        next_run_at=clock.now.replace(year=2027, month=3, day=28, hour=1, minute=30),
    )
    add_routine(
        store,
        "capped",
        suspended_until=clock.now + timedelta(hours=2),
        suspended_reason="ceiling spent",
    )
    add_run(store, routine, "nightly@1", "failed", clock.now, clock.now)
    add_routine(store, "gone", source="code", owner="proj", retired_at=clock.now)
    page = client_for(admin).get("/routines").text
    assert "retired (no longer declared in code since 2026-11-30 12:00:00 UTC)" in page
    assert "suspended until 2026-11-30 14:00:00 UTC: ceiling spent" in page
    # 02:30 does not exist in Rome on 2027-03-28: the window's DST note.
    assert "shifted: 02:30 does not exist" in page
    assert "2027-03-28 03:30:00 CEST" in page and "2027-03-28 01:30:00 UTC" in page
    assert 'class="cell failed"' in page
    assert "page 1 of 1" in page


def test_a_routine_page_shows_windows_attempts_skips_ceilings_and_lateness(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    routine = add_routine(
        store,
        "poll",
        cron="*/5 * * * *",
        timezone="Europe/Rome",
        ceiling='[{"limit": 100, "per": "day", "unit": "fires"}]',
    )
    sent = clock.now - timedelta(minutes=30)
    add_run(
        store, routine, "poll@a", "failed", sent, sent, sent_at=sent + timedelta(seconds=2),
        error="ZeroDivisionError: division by zero", worker="celery@w1",
    )  # fmt: skip
    add_run(
        store, routine, "poll@s", "skipped", clock.now, clock.now, reason="overlap",
        skipped_count=3,
    )  # fmt: skip
    page = client_for(admin, flower_url="http://flower:5555").get("/routines/poll").text
    assert "ZeroDivisionError: division by zero" in page and "celery@w1" in page
    assert "overlap" in page and ">3<" in page
    assert "Next 10 windows" in page
    # The ceiling resets at the next midnight in the routine's zone.
    assert "2026-12-01 00:00:00 CET" in page
    assert "<svg" in page and page.count('class="dot"') == 1
    assert "2.000 s late" in page
    assert "http://flower:5555/task/" in page
    # The backfill form's defaults are wall times in the routine's zone
    # (12:00 UTC is 13:00 in Rome), which is how the form reads them.
    assert 'value="2026-11-30T12:00"' in page and 'value="2026-11-30T13:00"' in page


def test_a_pages_csrf_token_expires_and_the_refusal_says_to_reload(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    add_routine(store, "nightly")
    client = client_for(admin)
    token = csrf_of(client.get("/routines/nightly").text)
    clock.advance(hours=11, minutes=59)  # within a working day: still good
    kept = client.post("/actions/pause", data={"name": "nightly", "csrf_token": token})
    assert kept.status_code in (200, 303), kept.text
    assert store.routines.by_name("nightly").paused is True
    clock.advance(minutes=2)  # past 12 hours
    stale = client.post("/actions/resume", data={"name": "nightly", "csrf_token": token})
    assert stale.status_code == 403 and "expired" in stale.text and "reload the page" in stale.text
    api = client.post("/api/routines/nightly/resume", headers={"X-CSRF-Token": token})
    assert api.status_code == 403 and "reload the page" in api.json()["error"]
    assert store.routines.by_name("nightly").paused is True
    # A token with its time moved forward is not the panel's.
    forged = f"{int(clock().timestamp()):010x}{token[10:]}"
    wrong = client.post("/actions/resume", data={"name": "nightly", "csrf_token": forged})
    assert wrong.status_code == 403 and "missing or wrong" in wrong.text
    fresh = csrf_of(client.get("/routines/nightly").text)
    resumed = client.post("/actions/resume", data={"name": "nightly", "csrf_token": fresh})
    assert resumed.status_code in (200, 303) and store.routines.by_name("nightly").paused is False


def test_a_form_post_needs_the_pages_csrf_token(admin: Routines, store: Store) -> None:
    add_routine(store, "nightly")
    client = client_for(admin)
    page = client.get("/routines/nightly").text
    refused = client.post("/actions/pause", data={"name": "nightly"})
    assert refused.status_code == 403 and "CSRF" in refused.text
    wrong = client.post("/actions/pause", data={"name": "nightly", "csrf_token": "0" * 64})
    assert wrong.status_code == 403
    assert store.routines.by_name("nightly").paused is False

    done = client.post(
        "/actions/pause",
        data={"name": "nightly", "csrf_token": csrf_of(page)},
        follow_redirects=True,
    )
    assert done.status_code == 200 and "paused nightly" in done.text
    assert store.routines.by_name("nightly").paused is True
    assert 'id="resume"' in done.text


def test_backfill_shows_the_count_first_and_sends_only_when_confirmed(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "hourly", cron="0 * * * *", overlap="overlap")
    client = client_for(admin)
    token = csrf_of(client.get("/routines/hourly").text)
    form = {"name": "hourly", "from": "2026-11-30T08:00Z", "to": "2026-11-30T11:00Z"}
    preview = client.post("/actions/backfill", data={**form, "csrf_token": token})
    assert re.search(r'id="backfill-count">4<', preview.text)
    assert admin.runs("hourly") == []
    done = client.post(
        "/actions/backfill",
        data={**form, "csrf_token": token, "confirm": "1"},
        follow_redirects=True,
    )
    assert "4 sent, 0 already stored" in done.text
    assert len(admin.runs("hourly")) == 4
    # Under skip one window goes out at a time: the count is still the range's.
    add_routine(store, "skipping", cron="0 * * * *", overlap="skip")
    form = {**form, "name": "skipping", "confirm": "1", "csrf_token": token}
    done = client.post("/actions/backfill", data=form, follow_redirects=True)
    assert "backfill of skipping: 4 window(s), 1 sent, 0 already stored, 0 failed; 3 left" in (
        html.unescape(done.text)
    )
    error = client.post("/actions/backfill", data={**form, "to": "2099-01-01", "csrf_token": token})
    assert error.status_code == 400 and "is in the future" in error.text


def test_read_only_hides_every_action_and_refuses_posts(admin: Routines, store: Store) -> None:
    add_routine(store, "nightly")
    client = client_for(admin, read_only=True)
    page = client.get("/routines/nightly").text
    assert '<form method="post"' not in page and 'id="pause"' not in page
    refused = client.post("/actions/pause", data={"name": "nightly"})
    assert refused.status_code == 403 and "read-only" in refused.text
    api = client.post("/api/routines/nightly/pause", headers={"Authorization": "Bearer x"})
    assert api.json() == {"error": "the panel is read-only (started with --read-only)"}
    assert store.routines.by_name("nightly").paused is False


def test_names_errors_and_reasons_are_escaped_and_passwords_masked(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    routine = add_routine(store, SCRIPT)
    add_run(store, routine, f"{SCRIPT}@1", "skipped", clock.now, clock.now, reason=SCRIPT)
    client = client_for(admin)
    for path in (
        "/routines",
        "/skips",
        "/runs",
        "/routines/%3Cscript%3Ealert%281%29%3C%2Fscript%3E",
    ):
        page = client.get(path).text
        assert SCRIPT not in page, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, path
    admin.settings = type(admin.settings)(database_url="postgresql://u:hunter2@db:5432/x")
    page = client.get("/routines").text
    assert "hunter2" not in page and "postgresql://u:***@db:5432/x" in page


def test_live_refresh_is_a_link_that_works_without_javascript(
    admin: Routines, store: Store
) -> None:
    client = client_for(admin)
    off = client.get("/routines?state=paused").text
    assert 'http-equiv="refresh"' not in off
    assert 'href="/routines?state=paused&amp;live=1"' in off
    on = client.get("/routines?state=paused&live=1").text
    assert '<meta http-equiv="refresh" content="5">' in on and 'data-live="1"' in on
    assert client.get("/static/panel.js").status_code == 200


def test_enable_disable_and_delete_record_who_did_it(admin: Routines, store: Store) -> None:
    add_routine(store, "adhoc", source="cli")
    client = client_for(admin)
    token = csrf_of(client.get("/routines/adhoc").text)
    done = client.post(
        "/actions/disable", data={"name": "adhoc", "csrf_token": token}, follow_redirects=True
    )
    assert "disabled adhoc" in done.text and 'id="enable"' in done.text
    assert store.routines.by_name("adhoc").enabled is False
    client.post("/actions/enable", data={"name": "adhoc", "csrf_token": token})
    assert store.routines.by_name("adhoc").enabled is True
    assert [(c.action, c.changed_by) for c in admin.history("adhoc")] == [
        ("enabled", "web:local"),
        ("disabled", "web:local"),
    ]
    ask = client.post("/actions/delete", data={"name": "adhoc", "csrf_token": token})
    assert 'id="confirm-delete"' in ask.text and store.routines.by_name("adhoc")
    client.post("/actions/delete", data={"name": "adhoc", "csrf_token": token, "confirm": "1"})
    assert store.routines.by_name("adhoc") is None


def test_a_routine_declared_in_code_offers_no_disable_and_the_api_says_why(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "nightly", source="code", owner="proj")
    client = client_for(admin)
    page = client.get("/routines/nightly").text
    assert 'id="disable"' not in page and 'id="delete"' not in page and 'id="pause"' in page
    assert "code (app proj)" in page
    refused = client.post("/api/routines/nightly/disable", headers=BEARER)
    assert refused.status_code == 400
    assert (
        "cannot disable it here: it is declared in the code of app 'proj'"
        in (refused.json()["error"])
    )
    client.post("/api/routines/nightly/pause", headers=BEARER)
    history = [(c.action, c.changed_by) for c in admin.history("nightly")]
    assert history == [("paused", "web:bearer")]


def test_mounted_under_a_prefix_its_links_and_forms_follow(admin: Routines, store: Store) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    from celery_routines.operator.web import create_app
    from celery_routines.operator.web.auth import WebAuth

    add_routine(store, "nightly")
    host = Starlette(
        routes=[Mount("/ops/routines", app=create_app(routines=admin, auth=WebAuth()))]
    )
    client = TestClient(host, base_url=BASE_URL)
    page = client.get("/ops/routines/routines").text
    assert 'href="/ops/routines/routines/nightly"' in page
    assert 'href="/ops/routines/static/panel.css"' in page
    assert 'href="/ops/routines/routines?live=1"' in page
    detail = client.get("/ops/routines/routines/nightly").text
    assert 'action="/ops/routines/actions/pause"' in detail
    done = client.post(
        "/ops/routines/actions/pause",
        data={"name": "nightly", "csrf_token": csrf_of(detail)},
        follow_redirects=False,
    )
    assert done.headers["location"].startswith("/ops/routines/routines/nightly?")
    assert client.get("/ops/routines/static/panel.js").status_code == 200


def test_the_runs_page_puts_open_runs_first_and_filters_by_time(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    routine = add_routine(store, "poll")
    old = clock.now - timedelta(days=2)
    add_run(store, routine, "poll@old", "succeeded", old, old)
    add_run(store, routine, "poll@new", "succeeded", clock.now, clock.now)
    add_run(store, routine, "poll@open", "running", old, old)
    client = client_for(admin)
    page = client.get("/runs").text
    open_part, finished_part = page.split("Finished runs")
    assert open_part.count("<tr data-run=") == 1 and "running" in open_part
    assert finished_part.count("<tr data-run=") == 2
    recent = client.get("/runs", params={"since": "1d", "state": "succeeded"}).text
    assert recent.count("<tr data-run=") == 1 and "Finished runs" not in recent
    older = client.get("/runs", params={"until": "1d"}).text
    assert older.count("<tr data-run=") == 2  # the open one and the old one
    bad = client.get("/runs", params={"until": "someday"})
    assert bad.status_code == 400 and "--until &#39;someday&#39; is not a date" in bad.text
