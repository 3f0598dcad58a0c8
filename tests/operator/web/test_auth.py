"""Who may use the panel: routines_web_auth, hashed passwords, the bearer
token, and the refusal to serve a non-loopback address without them."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from celery_routines.errors import ConfigurationError
from celery_routines.operator import cli
from celery_routines.operator.admin import Routines
from celery_routines.operator.web.auth import (
    check_bind,
    check_password,
    hash_password,
    parse_web_auth,
)
from celery_routines.store import Store
from tests.operator.web.conftest import TOKEN, client_for
from tests.operators import add_routine, cli_context, make_app

FAST = 1000  # iterations: the tests check the format, not the cost


def test_a_password_hash_checks_only_its_own_password() -> None:
    hashed = hash_password("s3cret", iterations=FAST)
    assert hashed.startswith("pbkdf2_sha256$1000$") and "s3cret" not in hashed
    assert check_password("s3cret", hashed)
    assert not check_password("s3cret!", hashed)
    assert not check_password("s3cret", "md5$x$y$z")
    assert hash_password("s3cret", iterations=FAST) != hashed  # salted


def test_the_setting_names_users_and_the_bearer_tokens_variable() -> None:
    hashed = hash_password("pw", iterations=FAST)
    auth = parse_web_auth(f"alice:{hashed}, bearer:PANEL_TOKEN", {"PANEL_TOKEN": "tok"})
    assert (dict(auth.users), auth.token) == ({"alice": hashed}, "tok")
    same = parse_web_auth(
        {"users": {"alice": hashed}, "bearer_env": "PANEL_TOKEN"}, {"PANEL_TOKEN": "tok"}
    )
    assert same == auth
    assert not parse_web_auth(None, {}).configured
    with pytest.raises(ConfigurationError, match="'PANEL_TOKEN', which is unset"):
        parse_web_auth("bearer:PANEL_TOKEN", {})
    with pytest.raises(ConfigurationError, match="user 'bob' is not a pbkdf2_sha256 hash") as bad:
        parse_web_auth("bob:plaintext", {})
    assert "plaintext" not in str(bad.value)


def test_a_token_written_in_place_of_its_variable_is_never_echoed() -> None:
    token = "q3Zt-Vx9kLm2Pw7rTz0aBcDeF"  # pasted after bearer: instead of a variable name
    with pytest.raises(ConfigurationError) as pasted:
        parse_web_auth(f"bearer:{token}", {})
    message = str(pasted.value)
    assert token not in message and token[:8] not in message, message
    assert f"of {len(token)} characters (not shown" in message
    with pytest.raises(ConfigurationError) as listed:
        parse_web_auth([f"bearer:{token}"], {})
    assert token not in str(listed.value) and "got a list" in str(listed.value)


def test_any_address_but_loopback_needs_authentication() -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_bind(host, parse_web_auth(None, {}))
    refusal = r"refusing to serve the panel on 0\.0\.0\.0 "
    with pytest.raises(ConfigurationError, match=refusal) as exc:
        check_bind("0.0.0.0", parse_web_auth(None, {}))
    assert "routines_web_auth" in str(exc.value) and "--hash-password" in str(exc.value)
    check_bind("0.0.0.0", parse_web_auth("bearer:T", {"T": "x"}))


def test_the_web_command_refuses_a_public_address_without_auth(tmp_path, sqlite_url) -> None:
    app = make_app(tmp_path / "broker", sqlite_url)
    result = CliRunner().invoke(cli.routines, ["web", "--host", "0.0.0.0"], obj=cli_context(app))
    assert result.exit_code == 1
    assert "refusing to serve the panel on 0.0.0.0 without authentication" in result.output


def test_with_users_configured_every_page_needs_a_login(admin: Routines, store: Store) -> None:
    add_routine(store, "nightly")
    auth = parse_web_auth(f"alice:{hash_password('pw', iterations=FAST)}", {})
    client = client_for(admin, auth=auth)
    anonymous = client.get("/routines")
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Basic")
    assert client.get("/api/routines").json() == {"error": "authentication required"}
    assert client.get("/routines", auth=("alice", "nope")).status_code == 401
    assert client.get("/routines", auth=("mallory", "pw")).status_code == 401
    page = client.get("/routines", auth=("alice", "pw"))
    assert page.status_code == 200 and "alice" in page.text
    # The bearer token opens the API too, and is what an API POST needs.
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/routines", headers=bearer).status_code == 200
    basic_post = client.post("/api/routines/nightly/pause", auth=("alice", "pw"))
    assert basic_post.status_code == 403
    assert client.post("/api/routines/nightly/pause", headers=bearer).status_code == 200


def test_the_audit_trail_tells_the_bearer_token_from_a_user_named_token(
    admin: Routines, store: Store
) -> None:
    add_routine(store, "nightly")
    auth = parse_web_auth(f"token:{hash_password('pw', iterations=FAST)}", {})
    client = client_for(admin, auth=auth)
    page = client.get("/routines/nightly", auth=("token", "pw")).text
    csrf = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert csrf is not None
    by_user = client.post(
        "/api/routines/nightly/pause", auth=("token", "pw"), headers={"X-CSRF-Token": csrf[1]}
    )
    assert by_user.status_code == 200, by_user.text
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/api/routines/nightly/resume", headers=bearer).status_code == 200
    history = {(c.action, c.changed_by) for c in admin.history("nightly")}
    assert history == {("paused", "web:token"), ("resumed", "web:bearer")}, history


def test_the_web_command_prints_a_hash_for_a_password_it_never_stores(tmp_path, sqlite_url) -> None:
    app = make_app(tmp_path / "broker", sqlite_url)
    result = CliRunner().invoke(
        cli.routines, ["web", "--hash-password"], obj=cli_context(app), input="pw\npw\n"
    )
    assert result.exit_code == 0, result.output
    hashed = result.output.strip().splitlines()[-1]
    assert hashed.startswith("pbkdf2_sha256$") and check_password("pw", hashed)
    assert parse_web_auth(f"alice:{hashed}", {}).users["alice"] == hashed


def test_a_password_piped_on_stdin_is_read_once_and_hashed(tmp_path, sqlite_url) -> None:
    """Not a terminal: one line is the password (no confirmation to abort on)."""
    app = make_app(tmp_path / "broker", sqlite_url)
    result = CliRunner().invoke(
        cli.routines, ["web", "--hash-password"], obj=cli_context(app), input="p w\n"
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("\n") == 1  # the hash, no prompt
    assert check_password("p w", result.output.strip())
    empty = CliRunner().invoke(
        cli.routines, ["web", "--hash-password"], obj=cli_context(app), input=""
    )
    assert empty.exit_code == 1
    assert empty.output.startswith("Error: --hash-password read no password from stdin")
    assert "Traceback" not in empty.output


def test_the_setting_and_the_token_may_come_from_secret_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hashed = hash_password("pw", iterations=FAST)
    (tmp_path / "auth").write_text(f"alice:{hashed} bearer:PANEL_TOKEN\n")
    (tmp_path / "token").write_text("tok-from-file\n")
    env = {
        "ROUTINES_WEB_AUTH_FILE": str(tmp_path / "auth"),
        "PANEL_TOKEN_FILE": str(tmp_path / "token"),
    }
    auth = parse_web_auth(None, env)
    assert (dict(auth.users), auth.token) == ({"alice": hashed}, "tok-from-file")
    # The setting itself wins over the file.
    assert parse_web_auth("bearer:PANEL_TOKEN", env).users == {}
    with pytest.raises(ConfigurationError, match=r"ROUTINES_WEB_AUTH_FILE names .* cannot be read"):
        parse_web_auth(None, {"ROUTINES_WEB_AUTH_FILE": str(tmp_path / "missing")})
