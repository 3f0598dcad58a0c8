"""Bulk actions (issue 33) in process, on SQLite and PostgreSQL: the API's
``POST /api/routines/bulk/{action}``, the list's bulk form with its
confirmation page, pause reasons shown wherever a paused routine shows, and
schedules in words in the API and on the pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from celery_routines.operator.admin import Routines
from celery_routines.store import Store
from tests.harness import published
from tests.operator.web.conftest import BEARER, client_for
from tests.operator.web.test_pages import csrf_of
from tests.operators import add_routine


def bulk(client: Any, action: str, data: Any, headers: dict[str, str] = BEARER) -> Any:
    return client.post(f"/api/routines/bulk/{action}", json=data, headers=headers)


def test_a_bulk_pause_needs_a_reason_and_the_reason_shows_wherever_it_is_paused(
    admin: Routines, store: Store
) -> None:
    for name in ("etl-a", "etl-b", "report"):
        add_routine(store, name)
    client = client_for(admin)
    refused = bulk(client, "pause", {"names": ["etl-a", "etl-b"]})
    assert refused.status_code == 400 and "a pause needs a reason" in refused.json()["error"]
    assert not store.routines.by_name("etl-a").paused

    done = bulk(client, "pause", {"names": ["etl-a", "etl-b"], "reason": "  warehouse  migration "})
    assert done.status_code == 200, done.text
    answer = done.json()
    assert (answer["count"], answer["changed"], answer["refused"]) == (2, 2, 0)
    assert answer["reason"] == "warehouse migration"
    assert [r["routine"] for r in answer["routines"]] == ["etl-a", "etl-b"]
    for name in ("etl-a", "etl-b"):
        record = store.routines.by_name(name)
        assert record.paused and record.paused_reason == "warehouse migration"
    assert not store.routines.by_name("report").paused

    # The list (API and page), the routine (API and page) all say why.
    rows = {
        r["summary"]["name"]: r["summary"] for r in client.get("/api/routines").json()["routines"]
    }
    assert rows["etl-a"]["paused_reason"] == "warehouse migration"
    assert rows["report"]["paused_reason"] is None
    shown = client.get("/api/routines/etl-b").json()
    assert shown["summary"]["paused_reason"] == "warehouse migration"
    assert "warehouse migration" in client.get("/routines?state=paused").text
    assert 'id="paused-reason">warehouse migration<' in client.get("/routines/etl-a").text
    # Audited once per routine, with the person and the reason.
    [change] = admin.history("etl-a", limit=1)
    assert change.action == "paused" and change.changed_by.startswith("web:")
    assert change.detail == {"reason": "warehouse migration"}

    # Resume in bulk by filter: the reason goes with the pause.
    again = bulk(client, "resume", {"filter": {"state": "paused"}})
    assert again.status_code == 200 and again.json()["changed"] == 2
    assert store.routines.by_name("etl-a").paused_reason is None


def test_bulk_actions_act_on_a_filter_and_report_each_routine(
    admin: Routines, store: Store, tmp_path: Path
) -> None:
    add_routine(store, "sync-1")
    add_routine(store, "sync-2", enabled=False)
    add_routine(store, "coded", source="code", owner="proj")
    add_routine(store, "other")
    client = client_for(admin)
    enabled = bulk(client, "enable", {"filter": {"name": "sync"}}).json()
    assert [(r["routine"], r["outcome"]) for r in enabled["routines"]] == [
        ("sync-1", "already enabled"),
        ("sync-2", "enabled"),
    ]
    # A routine declared in code is refused, naming why; the others go ahead.
    disabled = bulk(client, "disable", {"names": ["coded", "sync-1"]}).json()
    assert disabled["refused"] == 1 and disabled["changed"] == 1
    refusal = disabled["routines"][0]
    assert refusal["routine"] == "coded" and "declared in the code" in refusal["error"]
    assert store.routines.by_name("coded").enabled
    assert not store.routines.by_name("sync-1").enabled

    triggered = bulk(client, "trigger", {"names": ["other", "sync-2"]}).json()
    assert [r["outcome"] for r in triggered["routines"]] == ["sent", "sent"]
    assert len(published(tmp_path / "broker")) == 2
    assert [c.action for c in admin.history("other", limit=1)] == ["triggered"]


@pytest.mark.parametrize(
    ("action", "data", "status", "named"),
    [
        ("explode", {"names": ["a"]}, 404, "'explode'"),
        ("pause", {"names": ["a", "ghost", "phantom"], "reason": "x"}, 404, "'ghost', 'phantom'"),
        ("resume", {"names": ["ghost"]}, 404, "'ghost'"),
        ("resume", {}, 400, "names"),
        ("resume", {"names": "a"}, 400, "'a'"),
        ("resume", {"names": [1]}, 400, "[1]"),
        ("resume", {"names": ["a"], "filter": {}}, 400, "not both"),
        ("resume", {"filter": {"state": "sleepy"}}, 400, "'sleepy'"),
        ("resume", {"filter": {"owner": "me"}}, 400, "'owner'"),
        ("resume", {"filter": "paused"}, 400, "'paused'"),
        ("resume", {"names": ["a"], "why": "x"}, 400, "'why'"),
        ("resume", {"names": ["a"], "reason": "x"}, 400, "only given for a pause"),
        ("pause", {"names": ["a"], "reason": 7}, 400, "7"),
        ("pause", {"names": ["a"], "reason": "x" * 201}, 400, "201 characters"),
        ("pause", [1, 2], 400, "JSON object"),
    ],
)
def test_bad_bulk_input_is_a_4xx_naming_the_value(
    admin: Routines, store: Store, action: str, data: Any, status: int, named: str
) -> None:
    add_routine(store, "a")
    answer = bulk(client_for(admin), action, data)
    assert answer.status_code == status, answer.text
    assert named in answer.json()["error"]
    assert not store.routines.by_name("a").paused


def test_a_bulk_post_needs_the_token_and_a_routine_named_bulk_is_still_a_routine(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "bulk")
    client = client_for(admin)
    refused = bulk(client, "pause", {"names": ["bulk"], "reason": "x"}, headers={})
    assert refused.status_code == 403
    token = csrf_of(client.get("/routines").text)
    with_csrf = bulk(client, "pause", {"names": ["bulk"], "reason": "x"}, {"X-CSRF-Token": token})
    assert with_csrf.status_code == 200 and store.routines.by_name("bulk").paused
    assert client.get("/api/routines/bulk").json()["summary"]["name"] == "bulk"
    read_only = client_for(admin, read_only=True)
    assert bulk(read_only, "resume", {"names": ["bulk"]}).status_code == 403


def test_the_list_form_confirms_how_many_and_which_then_pauses_with_the_reason(
    admin: Routines, store: Store
) -> None:
    for name in ("etl-a", "etl-b", "report"):
        add_routine(store, name)
    client = client_for(admin)
    page = client.get("/routines").text
    assert 'name="names" value="etl-a"' in page and 'id="bulk-pause"' in page
    token = csrf_of(page)
    form = {"csrf_token": token, "bulk_action": "pause", "names": ["etl-a", "etl-b"]}
    assert client.post("/actions/bulk", data={**form, "csrf_token": "0" * 64}).status_code == 403
    ask = client.post("/actions/bulk", data={**form, "reason": "migration"})
    assert ask.status_code == 200
    assert 'id="bulk-title">Pause 2 routines<' in ask.text
    assert "<li>etl-a</li>" in ask.text and "<li>etl-b</li>" in ask.text
    assert "report" not in ask.text
    assert 'value="migration" required' in ask.text
    assert not store.routines.by_name("etl-a").paused  # nothing until confirmed

    no_reason = client.post("/actions/bulk", data={**form, "confirm": "1", "reason": ""})
    assert no_reason.status_code == 400 and "a pause needs a reason" in no_reason.text
    done = client.post(
        "/actions/bulk",
        data={**form, "confirm": "1", "reason": "migration"},
        follow_redirects=True,
    )
    assert "pause: 2 of 2 routine(s) changed (etl-a, etl-b); reason: migration" in done.text
    assert store.routines.by_name("etl-b").paused_reason == "migration"

    # "Every routine matching the filter": settled into names on the confirmation.
    ask = client.post(
        "/actions/bulk",
        data={"csrf_token": token, "bulk_action": "resume", "scope": "filter",
              "filter_state": "paused"},
    )  # fmt: skip
    assert 'id="bulk-title">Resume 2 routines<' in ask.text
    assert "every routine matching state &#39;paused&#39;" in ask.text
    nothing = client.post("/actions/bulk", data={"csrf_token": token, "bulk_action": "resume"})
    assert nothing.status_code == 400 and "name the routines" in nothing.text
    unknown = client.post("/actions/bulk", data={**form, "bulk_action": "explode"})
    assert unknown.status_code == 404 and "explode" in unknown.text


def test_schedules_show_in_words_beside_the_expression(admin: Routines, store: Store) -> None:
    add_routine(store, "nightly", cron="30 2 * * 1-5", timezone="Europe/Rome")
    add_routine(store, "poll", cron=None, interval_seconds=300)
    add_routine(store, "dawn", cron=None, solar="sunrise 45.46 9.19")
    client = client_for(admin)
    rows = {
        r["summary"]["name"]: r["summary"] for r in client.get("/api/routines").json()["routines"]
    }
    assert rows["nightly"]["schedule"] == "30 2 * * 1-5"
    assert rows["nightly"]["schedule_words"] == "At 02:30, Monday through Friday (Europe/Rome)"
    assert rows["poll"]["schedule_words"] == "Every 5 minutes"
    assert rows["dawn"]["schedule_words"] == "At sunrise at latitude 45.46, longitude 9.19"
    detail = client.get("/api/routines/nightly").json()["summary"]
    assert detail["schedule_words"] == rows["nightly"]["schedule_words"]
    listing = client.get("/routines").text
    assert "At 02:30, Monday through Friday (Europe/Rome)<div" in listing
    assert "<code>30 2 * * 1-5</code>" in listing
    page = client.get("/routines/nightly").text
    assert 'id="schedule-words">At 02:30, Monday through Friday (Europe/Rome)<' in page
    assert 'id="schedule-expression">30 2 * * 1-5<' in page
