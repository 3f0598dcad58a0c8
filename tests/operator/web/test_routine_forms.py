"""Creating, editing and cloning routines from the panel and its HTTP API,
in process on SQLite and PostgreSQL: ``POST
/api/routines`` (201), ``PATCH /api/routines/{name}`` (200, 409 for a code
routine), 422 naming every bad field in the CLI's words, one audited change
with the person, nothing stored lost on a bad edit, CSRF refused, and the
form pages with and without JavaScript (the plain POST)."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from starlette.testclient import TestClient

from celery_routines.operator.admin import Routines
from celery_routines.operator.web.auth import WebAuth, hash_password
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.operator.web.conftest import BEARER, client_for
from tests.operator.web.test_pages import csrf_of
from tests.operators import add_routine

NIGHTLY = {
    "name": "nightly-report",
    "task": "proj.tasks.report",
    "cron": "30 2 * * 1-5",
    "timezone": "Europe/Rome",
    "args": [1, "a"],
    "kwargs": {"full": True},
    "options": {"queue": "reports"},
    "catch_up": "latest",
    "max_lateness": "10m",
    "overlap": "queue",
    "max_retries": 2,
    "retry_base_seconds": 30,
    "ceiling": ["100/day"],
    "starts_at": "2026-12-01T00:00",
    "jitter": 5,
}


def create(client: TestClient, data: Any, headers: dict[str, str] = BEARER) -> Any:
    return client.post("/api/routines", json=data, headers=headers)


def patch(client: TestClient, name: str, data: Any, headers: dict[str, str] = BEARER) -> Any:
    return client.patch(f"/api/routines/{name}", json=data, headers=headers)


def row_of(store: Store, name: str) -> dict[str, Any]:
    record = store.routines.by_name(name)
    assert record is not None
    return {k: v for k, v in vars(record).items() if not k.startswith("_")}


def test_post_creates_a_routine_with_every_option_audited_with_the_person(
    admin: Routines, store: Store
) -> None:
    client = client_for(admin)
    answer = create(client, NIGHTLY)
    assert answer.status_code == 201, answer.text
    assert answer.json()["routine"] == "nightly-report"
    record = store.routines.by_name("nightly-report")
    assert record is not None and record.source == "cli"
    assert (record.cron, record.timezone, record.catch_up, record.overlap) == (
        "30 2 * * 1-5", "Europe/Rome", "latest", "queue",
    )  # fmt: skip
    assert (record.max_lateness, record.max_retries, record.retry_base_seconds) == (600, 2, 30)
    assert record.jitter_seconds == 5 and record.starts_at == datetime(2026, 11, 30, 23, tzinfo=UTC)
    # The names the API reads back are the names it was given.
    shown = client.get("/api/routines/nightly-report").json()["definition"]
    for key in ("cron", "timezone", "args", "kwargs", "options", "catch_up", "overlap"):
        assert shown[key] == NIGHTLY[key], key
    assert shown["ceiling"] == [{"limit": 100, "per": "day", "unit": "fires"}]
    [change] = admin.history("nightly-report")
    assert change.action == "added" and change.changed_by == "web:bearer"


@pytest.mark.parametrize(
    ("schedule", "column", "stored"),
    [
        ({"interval_seconds": 90}, "interval_seconds", 90),
        ({"interval_seconds": "1h30m"}, "interval_seconds", 5400),
        ({"at": "2026-12-24T18:00"}, "at", datetime(2026, 12, 24, 17, tzinfo=UTC)),
        ({"solar": "sunrise 45.46 9.19"}, "solar", "sunrise 45.46 9.19"),
        (
            {"rrule": "DTSTART:20260105T090000\nRRULE:FREQ=WEEKLY;BYDAY=MO"},
            "rrule",
            "DTSTART:20260105T090000\nRRULE:FREQ=WEEKLY;BYDAY=MO",
        ),
        ({"cron": ["0 9 * * 1", "0 18 * * 5"]}, "schedules", '["0 9 * * 1", "0 18 * * 5"]'),
    ],
)
def test_every_kind_of_schedule_is_created(
    admin: Routines, store: Store, schedule: dict[str, Any], column: str, stored: Any
) -> None:
    answer = create(
        client_for(admin), {"name": "r", "task": "t.x", "timezone": "Europe/Rome", **schedule}
    )
    assert answer.status_code == 201, answer.text
    assert row_of(store, "r")[column] == stored


def test_a_bad_body_is_422_naming_every_bad_field_and_nothing_is_stored(
    admin: Routines, store: Store
) -> None:
    bad = {
        "name": "broken",
        "task": "t.x",
        "cron": "61 * * * *",
        "timezone": "Mars/Base",
        "jitter": "x",
        "args": {"not": "a list"},
        "max_lateness": "5q",
        "ceiling": "lots",
        "overlap": "sometimes",
        "colour": "red",
    }
    answer = create(client_for(admin), bad)
    assert answer.status_code == 422, answer.text
    fields = answer.json()["fields"]
    assert set(fields) == set(bad) - {"name", "task"}
    # The CLI's words, each naming the value.
    assert "minute field '61' is out of range" in fields["cron"]
    assert "unknown timezone 'Mars/Base'" in fields["timezone"]
    assert "'5q'" in fields["max_lateness"] and "'lots'" in fields["ceiling"]
    assert "'sometimes'" in fields["overlap"] and "'colour'" in fields["colour"]
    assert answer.json()["error"]
    assert store.routines.by_name("broken") is None

    missing = create(client_for(admin), {"cron": "* * * * *"}).json()["fields"]
    assert set(missing) == {"name", "task"}
    together = create(
        client_for(admin), {"name": "b", "task": "t", "cron": "* * * * *", "interval_seconds": 60}
    )
    assert together.status_code == 422
    assert set(together.json()["fields"]) == {"cron", "interval_seconds"}


def test_a_name_already_stored_is_named(admin: Routines, store: Store) -> None:
    add_routine(store, "taken")
    answer = create(client_for(admin), {"name": "taken", "task": "t", "cron": "* * * * *"})
    assert answer.status_code == 422
    assert "already stored" in answer.json()["fields"]["name"]


def test_patch_edits_one_audited_change_and_a_bad_patch_loses_nothing(
    admin: Routines, store: Store
) -> None:
    client = client_for(admin)
    assert create(client, NIGHTLY).status_code == 201
    before = row_of(store, "nightly-report")
    bad = patch(client, "nightly-report", {"cron": "30 25 * * *", "max_retries": -1})
    assert bad.status_code == 422, bad.text
    assert set(bad.json()["fields"]) == {"cron", "max_retries"}
    assert "'30 25 * * *'" in bad.json()["fields"]["cron"]
    after = row_of(store, "nightly-report")
    assert after == before
    assert [c.action for c in admin.history("nightly-report")] == ["added"]

    done = patch(client, "nightly-report", {"cron": "0 3 * * *", "overlap": "skip"})
    assert done.status_code == 200, done.text
    assert done.json()["fields"] == {"cron": "0 3 * * *", "overlap": "skip"}
    record = store.routines.by_name("nightly-report")
    assert record is not None and (record.cron, record.overlap) == ("0 3 * * *", "skip")
    assert record.kwargs == before["kwargs"]  # what the patch did not name stays
    edited = admin.history("nightly-report", limit=1)[0]
    assert edited.action == "edited" and edited.changed_by == "web:bearer"
    assert patch(client, "ghost", {"cron": "* * * * *"}).status_code == 404
    renamed = patch(client, "nightly-report", {"name": "other"})
    assert renamed.status_code == 422 and "clone" in renamed.json()["fields"]["name"]


def test_run_timeout_is_a_field_of_the_api_and_null_clears_it(
    admin: Routines, store: Store
) -> None:
    client = client_for(admin)
    assert create(client, {**NIGHTLY, "run_timeout": "10m"}).status_code == 201
    assert row_of(store, "nightly-report")["run_timeout"] == 600.0
    bad = patch(client, "nightly-report", {"run_timeout": 0.5})
    assert bad.status_code == 422 and "at least 1 second" in bad.json()["fields"]["run_timeout"]
    assert row_of(store, "nightly-report")["run_timeout"] == 600.0
    words = patch(client, "nightly-report", {"run_timeout": "soon"})
    assert words.status_code == 422 and "'soon'" in words.json()["fields"]["run_timeout"]
    assert patch(client, "nightly-report", {"run_timeout": None}).status_code == 200
    assert row_of(store, "nightly-report")["run_timeout"] is None
    page = client.get("/new", headers=BEARER)
    assert 'name="run_timeout"' in page.text


def test_patch_of_a_routine_owned_by_code_is_409_naming_where(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "coded", source="code", owner="proj", task="proj.tasks.nightly")
    before = row_of(store, "coded")
    answer = patch(client_for(admin), "coded", {"cron": "0 4 * * *"})
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert "declared in the code of app 'proj'" in error and "proj.tasks.nightly" in error
    assert row_of(store, "coded") == before


def test_writes_without_the_csrf_token_or_bearer_are_refused(admin: Routines, store: Store) -> None:
    add_routine(store, "kept", cron="0 1 * * *")
    client = client_for(admin)
    assert create(client, NIGHTLY, headers={}).status_code == 403
    assert patch(client, "kept", {"cron": "0 2 * * *"}, headers={}).status_code == 403
    bad_token = {"X-CSRF-Token": "0" * 32}
    assert patch(client, "kept", {"cron": "0 2 * * *"}, headers=bad_token).status_code == 403
    check = client.post("/api/routines/validate", json={"fields": {}}, headers={})
    assert check.status_code == 403
    page = client.get("/new").text
    posted = client.post("/new", data={**form_of(NIGHTLY), "csrf_token": "nope"})
    assert posted.status_code == 403 and csrf_of(page)
    assert store.routines.by_name("nightly-report") is None
    assert row_of(store, "kept")["cron"] == "0 1 * * *"
    # With the page's token, the same request goes through.
    token = {"X-CSRF-Token": csrf_of(page)}
    assert patch(client, "kept", {"cron": "0 2 * * *"}, headers=token).status_code == 200


def test_validate_names_each_field_and_lists_the_next_windows_marking_dst(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    clock.now = datetime(2026, 10, 20, 12, tzinfo=UTC)
    client = client_for(admin)
    fields = {"name": "n", "task": "t.x", "cron": "30 2 * * *", "timezone": "Europe/Rome"}
    answer = client.post("/api/routines/validate", json={"fields": fields}, headers=BEARER).json()
    assert answer["ok"] and answer["fields"] == {} and len(answer["windows"]) == 10
    marked = [w["local"][:10] for w in answer["windows"] if w["dst_night"]]
    # The night of 25 October goes from CEST to CET (its 02:30 is the first
    # of two), and the window after it is the first at the new offset.
    assert marked == ["2026-10-25", "2026-10-26"]
    assert answer["windows"][4]["note"] == "first of two 02:30s"
    assert answer["windows"][0]["local_text"] == "2026-10-21 02:30:00 CEST"
    assert answer["windows"][0]["utc_text"] == "2026-10-21 00:30:00 UTC"

    bad = {**fields, "cron": "30 2 * *", "jitter": "soon"}
    answer = client.post("/api/routines/validate", json={"fields": bad}, headers=BEARER).json()
    assert not answer["ok"] and set(answer["fields"]) == {"cron", "jitter"}
    assert "'30 2 * *'" in answer["fields"]["cron"] and answer["windows"] == []


def form_of(values: dict[str, Any]) -> dict[str, str]:
    """The values as a person types them into the form."""
    texts = {}
    for key, value in values.items():
        if isinstance(value, list) and key in ("ceiling", "cron", "exclude"):
            texts[key] = "\n".join(value)
        elif isinstance(value, list | dict):
            texts[key] = json.dumps(value)
        else:
            texts[key] = str(value)
    return texts


def test_the_form_without_javascript_creates_and_comes_back_with_errors_next_to_fields(
    admin: Routines, store: Store
) -> None:
    client = client_for(admin, auth=WebAuth({"ada": hash_password("pw", iterations=1000)}))
    client.auth = ("ada", "pw")
    page = client.get("/new")
    assert page.status_code == 200
    for field in ("cron", "interval_seconds", "at", "solar", "rrule", "timezone", "args",
                  "kwargs", "options", "catch_up", "max_lateness", "overlap", "max_retries",
                  "ceiling", "starts_at", "ends_at", "jitter"):  # fmt: skip
        assert f'name="{field}"' in page.text, field
        assert f'aria-describedby="help-{field} error-{field}"' in page.text
    token = csrf_of(page.text)
    bad = client.post("/new", data={**form_of(NIGHTLY), "cron": "30 2 * *", "csrf_token": token})
    assert bad.status_code == 422
    error = re.search(r'id="error-cron"[^>]*>([^<]*)<', bad.text)
    assert error and "'30 2 * *'" in html.unescape(error.group(1))
    assert 'id="f-cron" name="cron" rows="2" aria-describedby' in bad.text
    assert store.routines.by_name("nightly-report") is None
    done = client.post(
        "/new", data={**form_of(NIGHTLY), "csrf_token": token}, follow_redirects=False
    )
    assert done.status_code == 303, done.text
    assert store.routines.by_name("nightly-report") is not None
    [change] = admin.history("nightly-report")
    assert change.changed_by == "web:ada"


def prefilled(page: str) -> dict[str, str]:
    """The form's values as the page fills them in (what a browser posts)."""
    found = {
        m[0]: m[1] for m in re.findall(r'<input id="f-\w+" name="(\w+)" value="([^"]*)"', page)
    }
    found.update(re.findall(r'<textarea id="f-\w+" name="(\w+)"[^>]*>([^<]*)</textarea>', page))
    for name, options in re.findall(
        r'<select id="f-\w+" name="(\w+)".*?>(.*?)</select>', page, re.S
    ):
        chosen = re.search(r'<option value="([^"]*)" selected>', options)
        found[name] = chosen.group(1) if chosen else ""
    return {key: html.unescape(value) for key, value in found.items()}


def test_edit_form_changes_only_what_differs_and_a_code_routine_is_read_only(
    admin: Routines, store: Store
) -> None:
    client = client_for(admin)
    assert create(client, NIGHTLY).status_code == 201
    page = client.get("/edit/nightly-report")
    assert page.status_code == 200 and ">30 2 * * 1-5</textarea>" in page.text
    token = csrf_of(page.text)
    texts = {**prefilled(page.text), "overlap": "skip", "csrf_token": token}
    assert texts["max_lateness"] == "600" and texts["catch_up_cap"] == "25"
    done = client.post("/edit/nightly-report", data=texts, follow_redirects=False)
    assert done.status_code == 303, done.text
    edited = admin.history("nightly-report", limit=1)[0]
    assert edited.action == "edited" and edited.detail == {"overlap": "skip"}
    before = row_of(store, "nightly-report")
    bad = client.post("/edit/nightly-report", data={**texts, "timezone": "Nowhere/City"})
    assert bad.status_code == 422 and "Nowhere/City" in bad.text
    assert row_of(store, "nightly-report") == before

    add_routine(store, "coded", source="code", owner="proj", task="proj.tasks.nightly")
    shown = client.get("/edit/coded").text
    assert "owned by code: code (app proj), task proj.tasks.nightly" in shown
    assert 'id="save"' not in shown and 'href="/clone/coded"' in shown
    refused = client.post("/edit/coded", data={"cron": "0 4 * * *", "csrf_token": token})
    assert refused.status_code == 409 and "declared in the code" in refused.text
    clone = client.get("/clone/coded").text
    assert 'value="coded-copy"' in clone and 'value="proj.tasks.nightly"' in clone
    assert 'id="save"' in clone


def test_the_openapi_document_describes_create_edit_and_validate(admin: Routines) -> None:
    paths = client_for(admin).get("/api/openapi.json").json()["paths"]
    create_body = paths["/api/routines"]["post"]["requestBody"]["content"]["application/json"]
    assert {"name", "task", "cron", "interval_seconds", "timezone", "jitter"} <= set(
        create_body["schema"]["properties"]
    )
    assert set(paths["/api/routines"]["post"]["responses"]) >= {"201", "422"}
    assert set(paths["/api/routines/{name}"]["patch"]["responses"]) >= {"200", "409", "422"}
    assert "post" in paths["/api/routines/validate"]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"name": "n", "task": "t", "cron": "* * * * *", "args": [NaN]}', "args"),
        ('{"name": "n", "task": "t", "cron": "* * * * *", "retry_base_seconds": Infinity}',
         "retry_base_seconds"),
        ('{"name": "n", "task": "t", "interval_seconds": 1e999}', "interval_seconds"),
        ('{"name": "n", "task": "t", "cron": "* * * * *", "jitter": 1e400}', "jitter"),
        ('{"name": "n", "task": "t", "at": "9999-12-31T23:59"}', "at"),
    ],
)  # fmt: skip
def test_values_past_json_or_the_calendar_are_422_naming_the_field(
    admin: Routines, store: Store, raw: str, field: str
) -> None:
    headers = {**BEARER, "Content-Type": "application/json"}
    answer = client_for(admin).post("/api/routines", content=raw, headers=headers)
    assert answer.status_code == 422, answer.text
    assert field in answer.json()["fields"], answer.json()
    assert store.routines.by_name("n") is None


def test_a_read_only_panel_shows_the_form_locked_and_refuses_writes(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "kept", cron="0 1 * * *")
    client = client_for(admin, read_only=True)
    assert create(client, NIGHTLY).status_code == 403
    assert patch(client, "kept", {"cron": "0 2 * * *"}).status_code == 403
    page = client.get("/edit/kept").text
    assert 'id="save"' not in page and 'id="new-routine"' not in page
    assert (
        'id="f-cron" name="cron" rows="2" aria-describedby="help-cron error-cron" readonly' in page
    )
    assert store.routines.by_name("nightly-report") is None
    assert row_of(store, "kept")["cron"] == "0 1 * * *"
