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
from tests.operators import add_routine

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
