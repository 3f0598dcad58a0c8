"""What every endpoint of a running panel shares: the :class:`Panel` (admin
API, guard, templates), errors in the CLI's words, and page rendering."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

import celery_routines.operator.web.present as present
from celery_routines.errors import RoutinesError
from celery_routines.operator.admin import OperationRefused, Routines
from celery_routines.operator.output import ceiling_words, words
from celery_routines.operator.web.auth import LOCAL, Guard
from celery_routines.operator.web.hosts import Hosts
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
    hosts: Hosts = field(default_factory=Hosts)
    # One action at a time: they share the publisher and the events connection.
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


def sent_path(request: Request) -> str:
    """The path as the client sent it, still quoted (``raw_path``)."""
    raw = request.scope.get("raw_path")
    return raw.decode("latin-1").split("?", 1)[0] if raw else quote(request.url.path, safe="/")


def name_after(request: Request, prefix: str) -> str:
    """The routine name in the path after ``prefix`` (``/routines/``), read
    from the path as sent and unquoted once: ``100%2541x`` is ``100%41x``."""
    path = sent_path(request)
    marker = request.scope.get("root_path", "") + prefix
    found = path.find(marker)
    return unquote(path[found + len(marker) :] if found >= 0 else path.rsplit("/", 1)[-1])


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


# OverflowError: a last net under the checks that name the field (a value
# past datetime's or C's range is bad input, never a 500).
HANDLED = (RoutinesError, ValueError, LookupError, SQLAlchemyError, OverflowError)


def refuse(api: bool, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    if api:
        return JSONResponse({"error": message}, status_code=status, headers=headers)
    return PlainTextResponse(message, status_code=status, headers=headers)


def jsonable_error(exc: BaseException, panel: Panel) -> JSONResponse:
    return JSONResponse({"error": error_text(exc, panel)}, status_code=error_status(exc))


def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    """A page, with what every page needs."""
    panel = panel_of(request)
    principal = getattr(request.state, "principal", LOCAL)
    live = request.query_params.get("live") == "1"
    params = [(k, v) for k, v in request.query_params.multi_items() if k not in ("live", "msg")]
    if not live:
        params.append(("live", "1"))
    # The path as sent (still quoted): a name holding "%41" or "/" must come
    # back as the same routine, not as its decoded spelling.
    toggle = sent_path(request) + ("?" + urlencode(params) if params else "")
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
