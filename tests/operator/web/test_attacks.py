"""The panel under attack, request by request (issue 30): DNS rebinding,
principals of two schemes, a reverse proxy's headers, headers on refusals,
body size, odd names. Each test fails when its guard is removed."""

from __future__ import annotations

import base64

import pytest

from celery_routines.operator.admin import Routines
from celery_routines.operator.web.auth import WebAuth, hash_password, parse_web_auth
from celery_routines.store import Store
from tests.operator.web.conftest import BEARER, TOKEN, client_for
from tests.operator.web.test_pages import csrf_of
from tests.operators import add_routine, make_app

FAST = 1000
EVIL = {"Host": "evil.example:8555"}


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# -- 1. DNS rebinding -------------------------------------------------------------


def test_a_foreign_host_name_is_refused_on_every_request(admin: Routines, store: Store) -> None:
    add_routine(store, "nightly")
    client = client_for(admin)
    page = client.get("/routines/nightly")
    assert page.status_code == 200
    csrf = csrf_of(page.text)
    # The page a rebinding attacker reads: refused, no token inside.
    for path in ("/routines/nightly", "/api/routines/nightly", "/healthz", "/static/panel.js"):
        refused = client.get(path, headers=EVIL)
        assert refused.status_code == 400, path
        assert csrf not in refused.text
        assert "'evil.example:8555' is not a name this panel answers to" in refused.text
        assert refused.headers["X-Frame-Options"] == "DENY"
    # The action it would send, with a token it could have read before the fix.
    for path, headers in (
        ("/api/routines/nightly/trigger", {"X-CSRF-Token": csrf}),
        ("/api/routines/nightly/pause", BEARER),
    ):
        sent = client.post(path, headers={**EVIL, "Origin": "http://evil.example:8555", **headers})
        assert sent.status_code == 400
    form = client.post(
        "/actions/pause",
        data={"name": "nightly", "csrf_token": csrf},
        headers={**EVIL, "Origin": "http://evil.example:8555"},
        follow_redirects=False,
    )
    assert form.status_code == 400
    assert store.routines.by_name("nightly").paused is False
    assert admin.runs("nightly") == []


def test_with_a_login_a_foreign_host_is_refused_too(admin: Routines, store: Store) -> None:
    add_routine(store, "nightly")
    auth = parse_web_auth(f"alice:{hash_password('pw', iterations=FAST)}", {})
    client = client_for(admin, auth=auth)
    assert client.get("/routines", headers=_basic("alice", "pw")).status_code == 200
    assert client.get("/routines", headers={**_basic("alice", "pw"), **EVIL}).status_code == 400
    assert client.get("/api/routines", headers={**BEARER, **EVIL}).status_code == 400


@pytest.mark.parametrize(
    ("options", "host", "status"),
    [
        ({}, "localhost:8555", 200),
        ({}, "127.0.0.1:8555", 200),
        ({}, "[::1]:8555", 200),
        ({}, "LOCALHOST.", 200),
        ({}, "panel.lan:8555", 400),
        ({"bind_host": "panel.lan"}, "panel.lan:8555", 200),
        ({"bind_host": "0.0.0.0"}, "0.0.0.0:8555", 400),
        ({"allowed_hosts": "panel.example.com"}, "panel.example.com", 200),
        ({"allowed_hosts": "panel.example.com"}, "localhost:8555", 400),
        ({"allowed_hosts": ["a.example", "b.example"]}, "b.example:1", 200),
        ({"allowed_hosts": "*"}, "anything.example", 200),
        ({"trusted_origins": "https://panel.example.com"}, "panel.example.com", 200),
    ],
)
def test_the_allowed_host_names(
    admin: Routines, options: dict[str, object], host: str, status: int
) -> None:
    client = client_for(admin, **options)
    assert client.get("/routines", headers={"Host": host}).status_code == status


def test_the_allowed_hosts_setting_is_read_from_the_app(admin: Routines) -> None:
    admin.app.conf.routines_web_allowed_hosts = "panel.example.com, ops.example.com"
    client = client_for(admin)
    assert client.get("/routines", headers={"Host": "ops.example.com"}).status_code == 200
    assert client.get("/routines", headers={"Host": "localhost"}).status_code == 400


# -- 4. Principals of two schemes --------------------------------------------------


def test_a_basic_user_named_token_is_not_the_bearer_token(admin: Routines, store: Store) -> None:
    add_routine(store, "nightly")
    auth = WebAuth({"token": hash_password("pw", iterations=FAST)}, TOKEN)
    client = client_for(admin, auth=auth)
    assert client.get("/routines", headers=_basic("token", "pw")).status_code == 200
    refused = client.post("/api/routines/nightly/pause", headers=_basic("token", "pw"))
    assert refused.status_code == 403
    assert "X-CSRF-Token" in refused.json()["error"]
    assert store.routines.by_name("nightly").paused is False
    # The bearer token's CSRF token is not the basic user's either.
    guard = client.app.state.panel.guard  # type: ignore[attr-defined]
    from celery_routines.operator.web.auth import BEARER as BEARER_PRINCIPAL
    from celery_routines.operator.web.auth import Principal

    assert guard.csrf_token(Principal("basic", "token")) != guard.csrf_token(BEARER_PRINCIPAL)
    assert client.post("/api/routines/nightly/pause", headers=BEARER).status_code == 200


def test_no_bearer_token_exists_unless_configured(admin: Routines, store: Store) -> None:
    from celery_routines.operator.web import create_app
    from celery_routines.operator.web.auth import Guard

    auth = parse_web_auth(f"alice:{hash_password('pw', iterations=FAST)}", {})
    assert Guard(auth).api_token is None
    assert Guard(WebAuth()).api_token is None
    add_routine(store, "nightly")
    app = create_app(admin.app, routines=admin, auth=auth)
    from starlette.testclient import TestClient

    client = TestClient(app, base_url="http://localhost")
    for guess in ("", "None", "null"):
        answer = client.get("/api/routines", headers={"Authorization": f"Bearer {guess}"})
        assert answer.status_code == 401


# -- 9. Behind a reverse proxy ------------------------------------------------------

# What nginx sends for a form posted on https://panel.example.com: the upstream
# Host, the public one in X-Forwarded-Host, and the browser's Origin.
NGINX = {
    "Host": "127.0.0.1:8555",
    "X-Forwarded-Host": "panel.example.com",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-For": "203.0.113.7",
    "Origin": "https://panel.example.com",
    "Sec-Fetch-Site": "same-origin",
}


def _proxied_pause(client, headers=NGINX):  # type: ignore[no-untyped-def]
    page = client.get("/routines/nightly", headers={"Host": "127.0.0.1:8555"})
    return client.post(
        "/actions/pause",
        data={"name": "nightly", "csrf_token": csrf_of(page.text)},
        headers=headers,
        follow_redirects=False,
    )


def test_behind_a_proxy_a_form_post_is_accepted_from_the_allowed_proxy(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "nightly")
    proxied = {"allowed_hosts": "127.0.0.1 panel.example.com", "peer": ("127.0.0.1", 40000)}
    plain = client_for(admin, **proxied)
    refused = _proxied_pause(plain)
    assert refused.status_code == 403 and "cross-site" in refused.text
    trusting = client_for(admin, forwarded_allow_ips="127.0.0.1", **proxied)
    accepted = _proxied_pause(trusting)
    assert accepted.status_code == 303, accepted.text
    assert store.routines.by_name("nightly").paused is True


def test_forwarded_headers_from_anyone_else_are_ignored(admin: Routines, store: Store) -> None:
    add_routine(store, "nightly")
    client = client_for(
        admin,
        forwarded_allow_ips="127.0.0.1",
        allowed_hosts="127.0.0.1 panel.example.com",
        peer=("10.9.8.7", 40000),
    )
    assert _proxied_pause(client).status_code == 403
    # Nor can X-Forwarded-Host smuggle a foreign name past the allow-list.
    trusted = client_for(admin, forwarded_allow_ips="127.0.0.0/8", peer=("127.0.0.1", 1))
    smuggled = trusted.get("/routines", headers={"X-Forwarded-Host": "evil.example"})
    assert smuggled.status_code == 400
    assert store.routines.by_name("nightly").paused is False


def test_a_trusted_origin_names_the_public_origin_without_forwarded_headers(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "nightly")
    client = client_for(admin, trusted_origins="https://panel.example.com")
    plain_nginx = {k: v for k, v in NGINX.items() if not k.startswith("X-Forwarded")}
    assert _proxied_pause(client, plain_nginx).status_code == 303
    assert store.routines.by_name("nightly").paused is True
    other = {**plain_nginx, "Origin": "https://evil.example"}
    assert _proxied_pause(client, other).status_code == 403


# -- 10. the small ones -----------------------------------------------------------------


def test_a_quoted_slash_is_part_of_the_name(admin: Routines, store: Store) -> None:
    add_routine(store, "rep")
    add_routine(store, "rep/runs")
    client = client_for(admin)
    shown = client.get("/api/routines/rep%2Fruns")
    assert shown.status_code == 200 and shown.json()["summary"]["name"] == "rep/runs"
    assert client.get("/api/routines/rep/runs").json() == []  # the runs of rep
    assert client.get("/api/routines/rep%2Fruns/runs").json() == []
    paused = client.post("/api/routines/rep%2Fruns/pause", headers=BEARER)
    assert paused.status_code == 200 and paused.json()["routine"] == "rep/runs"
    assert store.routines.by_name("rep/runs").paused is True
    assert store.routines.by_name("rep").paused is False
    # An unquoted slash still reads as part of a name when no known word follows.
    add_routine(store, "team/report")
    assert client.get("/api/routines/team/report").json()["summary"]["name"] == "team/report"
    unknown = client.post("/api/routines/rep/explode", headers=BEARER)
    assert unknown.status_code == 404


def test_the_live_link_of_a_name_with_percent_escapes_leads_back_to_it(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "100%41x")
    client = client_for(admin)
    page = client.get("/routines/100%2541x")
    assert page.status_code == 200 and 'id="routine-name">100%41x<' in page.text
    assert 'href="/routines/100%2541x?live=1"' in page.text
    live = client.get("/routines/100%2541x?live=1")
    assert live.status_code == 200 and 'id="routine-name">100%41x<' in live.text


def test_every_refusal_and_a_crash_carry_the_security_headers(
    admin: Routines, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_routine(store, "nightly")
    auth = parse_web_auth(f"alice:{hash_password('pw', iterations=FAST)}", {})
    locked = client_for(admin, auth=auth)
    read_only = client_for(admin, read_only=True)
    plain = client_for(admin)
    plain_app = plain.app

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(admin, "page", crash)
    from starlette.testclient import TestClient

    crashing = TestClient(plain_app, base_url="http://localhost", raise_server_exceptions=False)
    answers = {
        400: plain.get("/routines", headers=EVIL),
        401: locked.get("/routines"),
        403: read_only.post("/api/routines/nightly/pause", headers=BEARER),
        500: crashing.get("/api/routines"),
    }
    for status, answer in answers.items():
        assert answer.status_code == status, (status, answer.text)
        assert answer.headers["X-Content-Type-Options"] == "nosniff", status
        assert answer.headers["X-Frame-Options"] == "DENY", status
        assert "frame-ancestors 'none'" in answer.headers["Content-Security-Policy"], status
    assert "boom" not in answers[500].text


def test_healthz_is_503_when_the_store_does_not_answer(tmp_path, clock) -> None:  # type: ignore[no-untyped-def]
    from celery_routines.operator.web import create_app

    url = f"sqlite:///{tmp_path}/missing/folder/routines.db"
    down = Routines(make_app(tmp_path / "broker", url), clock=clock, store=Store.from_url(url))
    from starlette.testclient import TestClient

    client = TestClient(
        create_app(down.app, routines=down, auth=WebAuth()),
        base_url="http://localhost",
        raise_server_exceptions=False,
    )
    answer = client.get("/healthz")
    assert (answer.status_code, answer.text) == (503, "store unavailable")
    down.close()


def test_a_body_over_a_megabyte_is_refused_before_anything_happens(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "nightly", paused=True)
    client = client_for(admin)
    big = b'{"catch_up": false, "pad": "' + b"x" * 1_100_000 + b'"}'
    refused = client.post("/api/routines/nightly/resume", content=big, headers=BEARER)
    assert refused.status_code == 413
    assert refused.json() == {"error": "the request body is over 1,000,000 bytes"}

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(11):
            yield b"x" * 100_000

    streamed = client.post("/api/routines/nightly/resume", content=chunks(), headers=BEARER)
    assert streamed.status_code == 413
    form = client.post("/actions/resume", content=big, headers={"Content-Type": "x"})
    assert form.status_code == 413 and "over 1,000,000 bytes" in form.text
    assert store.routines.by_name("nightly").paused is True
    fits = b'{"catch_up": false, "pad": "' + b"x" * 900_000 + b'"}'
    assert client.post("/api/routines/nightly/resume", content=fits, headers=BEARER).is_success


def test_a_backfill_preview_of_a_million_windows_is_counted_not_listed_nor_queued(
    admin: Routines, store: Store, clock
) -> None:  # type: ignore[no-untyped-def]
    import threading
    import time
    from datetime import timedelta

    add_routine(store, "everymin", cron="* * * * *")
    add_routine(store, "everysec", interval_seconds=1, next_run_at=clock.now)
    client = client_for(admin)
    lock = client.app.state.panel.lock  # type: ignore[attr-defined]
    answers: dict[str, object] = {}

    def preview(name: str, span: timedelta) -> None:
        started = time.perf_counter()
        answer = client.post(
            f"/api/routines/{name}/backfill",
            json={"from": (clock.now - span).isoformat(), "to": clock.now.isoformat(),
                  "max": 1_000_000, "preview": True},
            headers=BEARER,
        )  # fmt: skip
        answers[name] = (answer.json(), time.perf_counter() - started)

    with lock:  # an action under way: a preview does not wait for it
        for name, span in (("everymin", timedelta(minutes=999_000)),
                           ("everysec", timedelta(seconds=999_000))):  # fmt: skip
            thread = threading.Thread(target=preview, args=(name, span))
            thread.start()
            thread.join(20)
            assert not thread.is_alive(), f"the preview of {name} waited for the action lock"
    minute, minute_seconds = answers["everymin"]  # type: ignore[misc]
    second, second_seconds = answers["everysec"]  # type: ignore[misc]
    assert (minute["windows"], minute["to_send"]) == (999_001, 999_001)
    assert second["windows"] == 999_001
    # Listing them took 28-35 s; counting takes well under a second.
    assert minute_seconds < 3 and second_seconds < 3, (minute_seconds, second_seconds)
