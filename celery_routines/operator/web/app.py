"""The panel as an ASGI application: ``create_app(celery_app)``.

Mount it in your own server (``Mount("/routines", create_app(app))``) or run
it with ``celery -A proj routines web``. Every read and every action goes
through :class:`celery_routines.operator.admin.Routines`: the panel runs no
SQL of its own.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from celery import Celery
from jinja2 import Environment, PackageLoader, select_autoescape
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from celery_routines.clock import Clock, utc_now
from celery_routines.config import setting
from celery_routines.errors import RoutinesError
from celery_routines.operator.admin import OperationRefused, Routines
from celery_routines.operator.output import ceiling_words, words
from celery_routines.operator.web import present
from celery_routines.operator.web.auth import Guard, WebAuth, cross_site, parse_web_auth
from celery_routines.store.engine import explain_database_error, safe_url

STATIC = Path(__file__).resolve().parent / "static"
REFRESH_SECONDS = 5


@dataclass
class Panel:
    """What every endpoint of one running panel shares."""

    admin: Routines
    guard: Guard
    read_only: bool = False
    flower_url: str | None = None
    refresh_seconds: int = REFRESH_SECONDS
    # One send at a time: the publisher is not shared across threads.
    lock: threading.Lock = field(default_factory=threading.Lock)
    templates: Environment = field(init=False)

    def __post_init__(self) -> None:
        self.templates = Environment(
            loader=PackageLoader("celery_routines.operator.web", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )
        self.templates.filters.update(
            utc=present.utc,
            local=present.local,
            state_word=present.state_word,
            outcome=present.outcome_class,
            part=present.path_part,
            duration=present.duration,
            words=words,
            ceiling_words=ceiling_words,
        )

    @property
    def database(self) -> str:
        """The store's URL, password masked."""
        return safe_url(self.admin.settings.database_url)


def panel_of(request: Request) -> Panel:
    return request.app.state.panel


def error_status(exc: BaseException) -> int:
    if isinstance(exc, LookupError):
        return 404
    if isinstance(exc, OperationRefused):
        return 409
    if isinstance(exc, SQLAlchemyError):
        return 503
    return 400


def error_text(exc: BaseException, panel: Panel) -> str:
    """The CLI's wording: one line."""
    if isinstance(exc, SQLAlchemyError):
        return explain_database_error(exc, panel.admin.settings.database_url)
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


HANDLED = (RoutinesError, ValueError, LookupError, SQLAlchemyError)


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


def refuse(api: bool, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    if api:
        return JSONResponse({"error": message}, status_code=status, headers=headers)
    return PlainTextResponse(message, status_code=status, headers=headers)


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
    from celery_routines.operator.web import api, pages

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


def jsonable_error(exc: BaseException, panel: Panel) -> JSONResponse:
    return JSONResponse({"error": error_text(exc, panel)}, status_code=error_status(exc))


def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    """A page, with what every page needs."""
    panel = panel_of(request)
    principal = getattr(request.state, "principal", "local")
    live = request.query_params.get("live") == "1"
    params = [(k, v) for k, v in request.query_params.multi_items() if k not in ("live", "msg")]
    if not live:
        params.append(("live", "1"))
    toggle = request.url.path + ("?" + urlencode(params) if params else "")
    page = panel.templates.get_template(template).render(
        base=request.scope.get("root_path", ""),
        read_only=panel.read_only,
        csrf_token=panel.guard.csrf_token(principal),
        user=principal,
        database=panel.database,
        live=live,
        refresh_seconds=panel.refresh_seconds,
        live_toggle=toggle,
        msg=request.query_params.get("msg"),
        **context,
    )
    return Response(page, status_code=status, media_type="text/html; charset=utf-8")
