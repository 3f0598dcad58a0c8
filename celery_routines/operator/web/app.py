"""The panel as an ASGI application: ``create_app(celery_app)``.

Mount it in your own server (``Mount("/routines", create_app(app))``) or run
it with ``celery -A proj routines web``. Every read and every action goes
through :class:`celery_routines.operator.admin.Routines`: the panel runs no
SQL of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from celery import Celery
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

import celery_routines.operator.web.api as api
import celery_routines.operator.web.pages as pages
from celery_routines.clock import Clock, utc_now
from celery_routines.config import setting
from celery_routines.operator.admin import Routines
from celery_routines.operator.web.auth import Guard, WebAuth, cross_site, parse_web_auth
from celery_routines.operator.web.context import (
    REFRESH_SECONDS,
    STATIC,
    Panel,
    panel_of,
    refuse,
)


class GuardMiddleware(BaseHTTPMiddleware):
    """Authentication on every request; read-only, cross-site and API-token
    checks on every POST. Forms are checked for their CSRF token where they
    are read (:func:`celery_routines.operator.web.pages.action`)."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        panel = panel_of(request)
        if request.url.path == request.scope.get("root_path", "") + "/healthz":
            return await call_next(request)  # says "ok" and nothing else
        api = request.url.path.startswith(request.scope.get("root_path", "") + "/api")
        principal = panel.guard.principal(request.headers.get("authorization"))
        if principal is None:
            return refuse(
                api, 401, "authentication required", {"WWW-Authenticate": 'Basic realm="routines"'}
            )
        request.state.principal = principal
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            if panel.read_only:
                return refuse(api, 403, "the panel is read-only (started with --read-only)")
            if cross_site(request.headers, request.headers.get("host")):
                return refuse(api, 403, "cross-site POST refused")
            if api and principal != "token":
                csrf = request.headers.get("x-csrf-token")
                if not panel.guard.csrf_matches(principal, csrf):
                    return refuse(
                        api,
                        403,
                        "POST refused: send the bearer token (Authorization: Bearer <token>) "
                        "or the panel's X-CSRF-Token",
                    )
        response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "frame-ancestors 'none'; form-action 'self'",
        )
        return response


def create_app(
    celery_app: Celery | None = None,
    *,
    read_only: bool = False,
    routines: Routines | None = None,
    auth: WebAuth | None = None,
    clock: Clock = utc_now,
    flower_url: str | None = None,
    refresh_seconds: int = REFRESH_SECONDS,
) -> Starlette:
    """The panel for ``celery_app``'s routines, as an ASGI application.

    ``auth`` defaults to ``routines_web_auth``; ``flower_url`` to
    ``routines_flower_url``. Mounted in another server, binding is that
    server's business: put it behind authentication (or pass ``auth``)
    unless it serves loopback only.
    """
    admin = routines or Routines(celery_app, clock=clock)
    if auth is None:
        auth = parse_web_auth(setting(celery_app, "routines_web_auth"))
    panel = Panel(
        admin=admin,
        guard=Guard(auth),
        read_only=read_only,
        flower_url=flower_url or setting(celery_app, "routines_flower_url") or None,
        refresh_seconds=refresh_seconds,
    )

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        if routines is None:
            admin.close()

    app = Starlette(
        routes=[*api.routes(), *pages.routes(), Mount("/static", StaticFiles(directory=STATIC))],
        middleware=[Middleware(GuardMiddleware)],
        lifespan=lifespan,
    )
    app.state.panel = panel
    return app
