"""``celery routines web``: check the bind address against the configured
authentication, say where the panel is, and run uvicorn."""

from __future__ import annotations

import logging
import sys

import click

from celery_routines.config import setting
from celery_routines.operator.admin import Routines
from celery_routines.operator.web.auth import check_bind, hash_password, parse_web_auth
from celery_routines.store.engine import safe_url

logger = logging.getLogger("celery_routines.web")


def password_hash_prompt() -> str:
    """The hash of a password asked twice on a terminal, or read as one
    line from stdin when it is piped (a script or a secret manager has no
    second line to confirm with, and a confirmation would abort it)."""
    stdin = sys.stdin
    if stdin.isatty():
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
        return hash_password(password)
    password = stdin.readline().removesuffix("\n").removesuffix("\r")
    if not password:
        raise ValueError(
            "--hash-password read no password from stdin: pipe it as one line "
            "(printf '%s\\n' \"$PASSWORD\" | celery routines web --hash-password)"
        )
    return hash_password(password)


def serve(
    admin: Routines,
    *,
    host: str,
    port: int,
    read_only: bool,
    forwarded_allow_ips: str | None = None,
) -> None:
    if isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"--port must be a whole number from 1 to 65535, got {port}")
    # uvicorn wants an IPv6 address bare; people (and URLs) write it in brackets.
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        import uvicorn

        from celery_routines.operator.web.app import create_app
    except ImportError as exc:
        raise click.ClickException(
            f"the panel needs the web extra ({exc.name} is missing): "
            "pip install 'celery-routines[web]'"
        ) from None
    auth = parse_web_auth(setting(admin.app, "routines_web_auth"))
    # Refuses a non-loopback address without authentication, saying how.
    check_bind(host, auth)
    app = create_app(
        admin.app,
        read_only=read_only,
        routines=admin,
        auth=auth,
        bind_host=host,
        forwarded_allow_ips=forwarded_allow_ips,
    )
    hosts = app.state.panel.hosts
    shown = f"[{host}]" if ":" in host else host
    store = safe_url(admin.settings.database_url)
    click.echo(f"celery-routines panel on http://{shown}:{port}/ (store {store})")
    click.echo(
        "  read-only: no action is offered or accepted"
        if read_only
        else "  actions on; every POST needs the page's CSRF token or the API bearer token"
        if auth.token
        else "  actions on; every POST needs the page's CSRF token (no bearer token configured)"
    )
    click.echo(f"  answers to the host names: {', '.join(sorted(hosts.allowed))}")
    if hosts.forwarded_allow is None or hosts.forwarded_allow:
        click.echo(f"  X-Forwarded-* read from: {forwarded_allow_ips}")
    if not auth.configured:
        click.echo("  no authentication configured: serving loopback only")
    # proxy_headers off: X-Forwarded-* are read by the panel itself, from
    # --forwarded-allow-ips only (uvicorn would trust 127.0.0.1 by default).
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False, proxy_headers=False)
