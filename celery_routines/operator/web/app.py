"""The panel as an ASGI application: ``create_app(celery_app)``.

Mount it in your own server (``Mount("/routines", create_app(app))``) or run
it with ``celery -A proj routines web``. Every read and every action goes
through :class:`celery_routines.operator.admin.Routines`: the panel runs no
SQL of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from celery import Celery
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import celery_routines.operator.web.api as api
import celery_routines.operator.web.beats as beats
import celery_routines.operator.web.definitions_api as definitions_api
import celery_routines.operator.web.form_pages as form_pages
import celery_routines.operator.web.pages as pages
from celery_routines.clock import Clock, utc_now
from celery_routines.config import setting
from celery_routines.errors import ConfigurationError
from celery_routines.operator.admin import Routines
from celery_routines.operator.web.attempts import LIMIT, FailedLogins, Throttled
from celery_routines.operator.web.auth import (
    CSRF_MAX_AGE_SECONDS,
    Guard,
    WebAuth,
    parse_web_auth,
)
from celery_routines.operator.web.context import (
    REFRESH_SECONDS,
    STATIC,
    Panel,
    refuse,
)
from celery_routines.operator.web.hosts import Hosts

logger = logging.getLogger("celery_routines.web")

MAX_BODY_BYTES = 1_000_000
THROTTLED_DELAY = 0.25
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"frame-ancestors 'none'; form-action 'self'",
    ),
    (b"cache-control", b"no-store"),
)


class BodyTooLarge(Exception):
    pass


class GuardMiddleware:
    """Every request, in this order: a Host the panel answers to (else 400),
    authentication (401, or 429 past the failed-login limit), then for a POST:
    read-only, cross-site and CSRF/bearer checks (403), and a body of at most
    ``max_body`` bytes (413). Every answer, refusals and 500s included,
    carries the security headers. Forms are checked for their CSRF token
    where they are read (:func:`celery_routines.operator.web.pages.action`)."""

    def __init__(self, app: ASGIApp, panel: Panel, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.panel = panel
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def secured(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            refusal = await self.check(scope)
            if refusal is not None:
                await refusal(scope, receive, secured)
                return
            await self.app(scope, self.limited(receive), secured)
        except BodyTooLarge:
            if not started:
                api = _is_api(scope)
                limit = f"the request body is over {self.max_body:,} bytes"
                await refuse(api, 413, limit)(scope, receive, secured)
        except Exception:
            logger.exception("the panel failed answering %s %s", scope["method"], scope["path"])
            if not started:
                await PlainTextResponse("internal error (logged by the panel)", 500)(
                    scope, receive, secured
                )

    async def check(self, scope: Scope) -> Response | None:
        """A refusal, or None when the request may go on."""
        panel = self.panel
        headers = Headers(scope=scope)
        api = _is_api(scope)
        view = panel.hosts.view(scope, headers)
        if not panel.hosts.allows(view):
            # DNS rebinding: a foreign page reaching us under its own name.
            return refuse(
                api,
                400,
                f"Host {view.host!r} is not a name this panel answers to; add it to "
                "routines_web_allowed_hosts if it is yours",
            )
        if scope["path"] == scope.get("root_path", "") + "/healthz":
            return None  # says "ok" and nothing else
        try:
            principal = await panel.guard.authenticate(headers.get("authorization"), view.client)
        except Throttled as exc:
            if exc.first:
                logger.warning("logins refused from %s: %s", view.client, exc)
            # Not at once: a flood of guesses must not become a flood of cheap
            # answers (20 clients looping on an instant 429 kept two cores busy).
            await asyncio.sleep(THROTTLED_DELAY)
            return refuse(api, 429, str(exc), {"Retry-After": str(exc.retry_after)})
        if principal is None:
            return refuse(
                api, 401, "authentication required", {"WWW-Authenticate": 'Basic realm="routines"'}
            )
        scope.setdefault("state", {})["principal"] = principal
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return None
        if panel.read_only:
            return refuse(api, 403, "the panel is read-only (started with --read-only)")
        if panel.hosts.cross_site(headers, view):
            return refuse(api, 403, "cross-site POST refused")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            return refuse(api, 413, f"the request body is over {self.max_body:,} bytes")
        # Only the bearer token stands in for the CSRF token: basic auth is
        # sent by the browser by itself, whoever made the page that POSTs.
        problem = (
            panel.guard.csrf_problem(principal, headers.get("x-csrf-token"))
            if api and not principal.is_bearer
            else None
        )
        if problem == "expired":
            return refuse(
                api,
                403,
                "POST refused: the X-CSRF-Token has expired (a page's token is good for "
                f"{CSRF_MAX_AGE_SECONDS // 3600} hours): reload the page for a new one",
            )
        if problem is not None:
            return refuse(
                api,
                403,
                "POST refused: send the bearer token (Authorization: Bearer <token>) "
                "or the panel's X-CSRF-Token",
            )
        return None

    def limited(self, receive: Receive) -> Receive:
        """``receive``, refusing a body past ``max_body`` bytes (one sent
        without a Content-Length is counted as it arrives)."""
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge
            return message

        return counted


def _is_api(scope: Scope) -> bool:
    return str(scope["path"]).startswith(scope.get("root_path", "") + "/api")


def create_app(
    celery_app: Celery | None = None,
    *,
    read_only: bool = False,
    routines: Routines | None = None,
    auth: WebAuth | None = None,
    clock: Clock = utc_now,
    flower_url: str | None = None,
    refresh_seconds: int = REFRESH_SECONDS,
    bind_host: str | None = None,
    allowed_hosts: object = None,
    trusted_origins: object = None,
    forwarded_allow_ips: object = None,
    max_body: int = MAX_BODY_BYTES,
) -> Starlette:
    """The panel for ``celery_app``'s routines, as an ASGI application.

    ``auth`` defaults to ``routines_web_auth``; ``flower_url`` to
    ``routines_flower_url``; ``allowed_hosts`` to ``routines_web_allowed_hosts``
    (else the loopback names plus ``bind_host``); ``trusted_origins`` to
    ``routines_web_trusted_origins``; ``forwarded_allow_ips`` to
    ``routines_web_forwarded_allow_ips`` (no proxy trusted). Mounted in
    another server, binding is that server's business: put it behind
    authentication (or pass ``auth``) unless it serves loopback only, and
    name the host it is reached under.
    """
    admin = routines or Routines(celery_app, clock=clock)
    if auth is None:
        auth = parse_web_auth(setting(celery_app, "routines_web_auth"))
    panel = Panel(
        admin=admin,
        guard=Guard(
            auth, failed_logins=FailedLogins(limit=_login_limit(celery_app)), clock=admin.clock
        ),
        read_only=read_only,
        flower_url=flower_url or setting(celery_app, "routines_flower_url") or None,
        refresh_seconds=refresh_seconds,
        hosts=Hosts.configure(
            allowed_hosts or setting(celery_app, "routines_web_allowed_hosts"),
            bind_host=bind_host,
            trusted_origins=trusted_origins or setting(celery_app, "routines_web_trusted_origins"),
            forwarded_allow_ips=forwarded_allow_ips
            or setting(celery_app, "routines_web_forwarded_allow_ips"),
        ),
    )

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        panel.guard.close()
        if routines is None:
            admin.close()

    app = Starlette(
        routes=[
            *definitions_api.routes(),  # before the API's: /api/routines/validate
            *api.routes(),
            *beats.routes(),
            *form_pages.routes(),
            *pages.routes(),
            Mount("/static", StaticFiles(directory=STATIC)),
        ],
        middleware=[Middleware(GuardMiddleware, panel=panel, max_body=max_body)],
        lifespan=lifespan,
    )
    app.state.panel = panel
    return app


def _login_limit(celery_app: Celery | None) -> int:
    raw = setting(celery_app, "routines_web_login_limit")
    if raw is None or raw == "":
        return LIMIT
    try:
        limit = int(raw)
    except (TypeError, ValueError):
        limit = 0
    if isinstance(raw, bool) or not 1 <= limit <= 1_000_000:
        raise ConfigurationError(
            "routines_web_login_limit (failed logins per client and per user name per "
            f"minute) must be a whole number from 1 to 1000000, got {raw!r}"
        )
    return limit
