"""The panel's HTTP API in process, on SQLite and PostgreSQL: the admin API's
answers as JSON, errors as {"error": ...} in the CLI's words, and every POST
needing the bearer token or the panel's CSRF token."""

from __future__ import annotations

from datetime import timedelta

from celery_routines.operator.admin import Routines
from celery_routines.operator.web.auth import LOCAL
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.harness import published
from tests.operator.web.conftest import BEARER, client_for
from tests.operators import add_routine, add_run, set_columns


def test_routines_are_listed_by_page_and_filtered_by_state_and_name(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    for i in range(120):
        add_routine(store, f"job-{i:03d}", paused=(i % 10 == 0))
    add_routine(store, "bad", last_error="cron '61 * * * *': minute 61 is out of range")
    add_routine(
        store,
        "capped",
        suspended_until=clock.now + timedelta(hours=2),
        suspended_reason="ceiling 1 fires per day spent",
    )
    add_routine(store, "100%_literal")
    client = client_for(admin)

    first = client.get("/api/routines", params={"per_page": 50}).json()
    assert (first["total"], first["pages"], len(first["routines"])) == (123, 3, 50)
    third = client.get("/api/routines", params={"per_page": 50, "page": 3}).json()
    assert len(third["routines"]) == 23
    names = [r["summary"]["name"] for r in third["routines"]]
    assert names == sorted(names) and names[-1] == "job-119"
    assert [r["name"] for r in third["routines"]] == names  # at the top level, as a client reads it

    paused = client.get("/api/routines", params={"state": "paused", "per_page": 500}).json()
    assert paused["total"] == 12
    assert {r["summary"]["state"] for r in paused["routines"]} == {"paused"}
    for state, name in (("invalid", "bad"), ("suspended", "capped")):
        found = client.get("/api/routines", params={"state": state}).json()
        assert [r["summary"]["name"] for r in found["routines"]] == [name]
    active = client.get("/api/routines", params={"state": "active"}).json()
    assert active["total"] == 123 - 12 - 2
    # The name filter is a literal part of the name: % and _ are characters.
    literal = client.get("/api/routines", params={"name": "0%_"}).json()
    assert [r["summary"]["name"] for r in literal["routines"]] == ["100%_literal"]
    assert client.get("/api/routines", params={"name": "job-11"}).json()["total"] == 10

    wrong = client.get("/api/routines", params={"state": "sleepy"})
    assert wrong.status_code == 400
    assert wrong.json() == {
        "error": "state 'sleepy' is unknown; use one of active, paused, suspended, invalid, "
        "disabled, retired"
    }


def test_each_routine_carries_a_strip_of_its_newest_30_runs(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    busy = add_routine(store, "busy")
    quiet = add_routine(store, "quiet")
    for i in range(40):
        at = clock.now - timedelta(minutes=5 * (40 - i))
        state = "failed" if i == 39 else "succeeded"
        add_run(store, busy, f"busy@{i}", state, at, at)
    add_run(store, quiet, "quiet@1", "skipped", clock.now, clock.now, reason="overlap")
    rows = {
        r["summary"]["name"]: r for r in client_for(admin).get("/api/routines").json()["routines"]
    }
    strip = rows["busy"]["recent"]
    assert len(strip) == 30
    assert strip[0]["state"] == "failed" and strip[0]["scheduled_for"] > strip[1]["scheduled_for"]
    assert rows["busy"]["summary"]["last_outcome"] == "failed"
    assert rows["quiet"]["recent"][0]["reason"] == "overlap"
    assert rows["quiet"]["summary"]["last_outcome"] == "skipped (overlap)"
    assert rows["busy"]["owner"] == "sql"


def test_a_routine_and_its_runs_and_the_errors_in_the_clis_words(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    routine = add_routine(store, "nightly", cron="30 2 * * *", timezone="Europe/Rome")
    early = clock.now - timedelta(hours=3)
    add_run(store, routine, "nightly@a", "failed", early, early)
    add_run(store, routine, "nightly@b", "succeeded", clock.now, clock.now)
    client = client_for(admin)

    detail = client.get("/api/routines/nightly").json()
    assert detail["summary"]["timezone"] == "Europe/Rome"
    assert len(detail["next_windows"]) == 10 and detail["owner"] == "sql"
    runs = client.get("/api/routines/nightly/runs", params={"state": "failed"}).json()
    assert [r["idempotency_key"] for r in runs] == ["nightly@a"]
    until = (clock.now - timedelta(hours=1)).isoformat()
    older = client.get("/api/runs", params={"until": until}).json()
    assert [r["idempotency_key"] for r in older] == ["nightly@a"]
    assert len(client.get("/api/runs", params={"routine": "nightly"}).json()) == 2

    missing = client.get("/api/routines/nope")
    assert (missing.status_code, missing.json()) == (
        404,
        {"error": "no routine named 'nope' is stored"},
    )
    bad_since = client.get("/api/runs", params={"since": "yesterday-ish"})
    assert bad_since.status_code == 400
    assert bad_since.json()["error"].startswith("--since 'yesterday-ish' is not a date")
    assert client.get("/api/openapi.json").json()["paths"]["/api/skips"]["get"]


def test_a_post_without_the_token_is_refused_and_with_it_pauses(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "nightly")
    client = client_for(admin)
    refused = client.post("/api/routines/nightly/pause")
    assert refused.status_code == 403 and "bearer token" in refused.json()["error"]
    wrong = client.post("/api/routines/nightly/pause", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403
    assert store.routines.by_name("nightly").paused is False

    done = client.post("/api/routines/nightly/pause", headers=BEARER)
    assert done.status_code == 200 and done.json()["changed"] is True
    assert store.routines.by_name("nightly").paused is True
    again = client.post("/api/routines/nightly/resume", headers=BEARER, json={"catch_up": True})
    assert again.json()["paused"] is False
    assert store.routines.by_name("nightly").paused is False

    # The panel's own CSRF token works as a header too (for its script).
    csrf = client.app.state.panel.guard.csrf_token(LOCAL)
    by_csrf = client.post("/api/routines/nightly/pause", headers={"X-CSRF-Token": csrf})
    assert by_csrf.status_code == 200


def test_a_cross_site_post_is_refused_whatever_it_carries(admin: Routines, store: Store) -> None:
    add_routine(store, "nightly")
    client = client_for(admin)
    for headers in (
        {**BEARER, "Sec-Fetch-Site": "cross-site"},
        {**BEARER, "Origin": "http://evil.example"},
    ):
        refused = client.post("/api/routines/nightly/pause", headers=headers)
        assert refused.status_code == 403
        assert refused.json() == {"error": "cross-site POST refused"}
    assert store.routines.by_name("nightly").paused is False
    same = client.post(
        "/api/routines/nightly/pause", headers={**BEARER, "Origin": "http://localhost"}
    )
    assert same.status_code == 200


def test_trigger_backfill_and_replay_through_the_api(
    admin: Routines, store: Store, clock: FakeClock, tmp_path
) -> None:
    routine = add_routine(store, "hourly", cron="0 * * * *", overlap="overlap")
    failed = add_run(store, routine, "hourly@x", "failed", clock.now - timedelta(days=2), clock.now)
    client = client_for(admin)
    assert client.post("/api/routines/hourly/trigger", headers=BEARER).json()["outcome"] == "sent"
    span = {"from": "2026-11-30T08:00Z", "to": "2026-11-30T10:00Z"}
    plan = client.post(
        "/api/routines/hourly/backfill", headers=BEARER, json={**span, "preview": True}
    ).json()
    assert (plan["windows"], plan["to_send"]) == (3, 3)
    assert len(admin.runs("hourly", limit=100)) == 2  # a preview sends nothing
    done = client.post("/api/routines/hourly/backfill", headers=BEARER, json=span).json()
    assert (done["sent"], done["existing"]) == (3, 0)
    assert len(published(tmp_path / "broker")) == 4
    replayed = client.post(f"/api/runs/{failed}/replay", headers=BEARER).json()
    assert (replayed["attempt"], replayed["outcome"]) == (2, "sent")

    future = client.post(
        "/api/routines/hourly/backfill",
        headers=BEARER,
        json={"from": "2026-11-30T08:00Z", "to": "2026-12-30T08:00Z"},
    )
    assert future.status_code == 400
    assert "is in the future" in future.json()["error"]
    unknown = client.post("/api/runs/nope/replay", headers=BEARER)
    assert unknown.json() == {"error": "no run with id 'nope' is stored"}
    set_columns(store, "hourly", overlap="skip")
    add_run(store, routine, "hourly@open", "running", clock.now, clock.now)
    refused = client.post("/api/routines/hourly/trigger", headers=BEARER)
    assert refused.status_code == 409 and "wait for it to finish" in refused.json()["error"]


def test_skips_list_every_decision_not_to_fire(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    routine = add_routine(store, "poll")
    add_run(
        store, routine, "poll@1", "skipped", clock.now, clock.now, reason="catch_up_cap",
        skipped_count=7,
    )  # fmt: skip
    [skip] = client_for(admin).get("/api/skips").json()
    assert (skip["routine"], skip["reason"], skip["skipped_count"]) == ("poll", "catch_up_cap", 7)
